"""The `x-agentproxy-policy` header may choose a policy, never escape one (issue 29).

A key the operator bound to a policy (its `match.keys` names the key: budgets, a loop ladder, a
circuit) must not step out of it by naming another policy (a dry-run one, one open to
everyone): each such name is answered as an unknown one, a 400 `policy_not_found`, before the
model is called (`default`, the built-in, was never a name a header could give). A key no
policy names keeps choosing among the policies open to everyone.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory, base_url, sim_config

METERED, FREE = "sk-metered-0001", "sk-free-0002"
CONFIG = f"""
store: {{path: STORE}}
keys:
  api_keys:
    - {{name: metered, key: {METERED}}}
    - {{name: free, key: {FREE}}}
policies:
  - name: metered
    match: {{keys: [metered]}}
    budgets: [{{name: calls, scope: key, limits: {{calls: 1}}}}]
  - name: trial
    match: {{keys: [metered], headers: {{x-trial: "1"}}}}
    budgets: [{{name: trial-calls, scope: key, limits: {{calls: 1}}}}]
  - name: watch-only
    match: {{headers: {{x-watch: "1"}}}}
    mode: dry_run
  - name: open
    match: {{headers: {{x-open: "1"}}}}
"""
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def proxy(start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer) -> TestServer:
    path = tmp_path / "policy-header.yaml"
    url = str(sim_server.make_url("")).rstrip("/")
    path.write_text(sim_config(url, CONFIG.replace("STORE", str(tmp_path / "state"))))
    return await start_proxy(path, watch=False)


def client(proxy: TestServer, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(proxy), api_key=key, max_retries=0)


async def ask(proxy: TestServer, key: str, policy: str | None = None) -> str:
    """The policy that served the request (its header)."""
    headers = {"x-agentproxy-policy": policy} if policy else {}
    raw = await client(proxy, key).chat.completions.with_raw_response.create(
        model="sim", messages=HI, extra_headers=headers
    )
    return raw.headers["x-agentproxy-policy"]


@pytest.mark.parametrize("escape", ["default", "watch-only", "open"])
async def test_a_bound_key_cannot_name_its_way_out_of_its_policy(
    proxy: TestServer, sim: Simulator, escape: str
) -> None:
    assert await ask(proxy, METERED) == "metered"
    with pytest.raises(openai.RateLimitError):  # its one call is spent
        await ask(proxy, METERED)
    calls = sim.request_count
    with pytest.raises(openai.BadRequestError) as refused:
        await ask(proxy, METERED, escape)
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "policy_not_found"
    assert error["message"] == (
        f"policy '{escape}' named by the x-agentproxy-policy header is not configured"
    )
    assert sim.request_count == calls  # the model was never called


async def test_a_bound_key_may_name_another_policy_bound_to_it(proxy: TestServer) -> None:
    assert await ask(proxy, METERED, "trial") == "trial"


async def test_a_free_key_chooses_among_the_open_policies(proxy: TestServer) -> None:
    assert await ask(proxy, FREE) == "default"
    assert await ask(proxy, FREE, "watch-only") == "watch-only"
    assert await ask(proxy, FREE, "open") == "open"
    with pytest.raises(openai.BadRequestError):  # bound to another key: unknown to this one
        await ask(proxy, FREE, "metered")
