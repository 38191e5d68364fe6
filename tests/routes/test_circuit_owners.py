"""A deployment's circuit and the tenants who see it fail, over real sockets (issue 29): one
key's failures, however many sessions it invents, must not open the circuit for another key;
a real outage seen by more than one key, or by the only tenant, still opens it."""

from __future__ import annotations

import asyncio
import textwrap
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory, base_url
from tests.support.sim_llama import LlamaCppSimulator

ALICE, BOB = "sk-alice-0123456789", "sk-bob-0123456789"


class Upstream:
    """A model server that crashes (a plain 500) on requests marked "poison" (only Bob sends
    them), or on every request during an outage."""

    def __init__(self) -> None:
        self.down = False

    async def __call__(self, chat: dict[str, Any]) -> dict[str, Any]:
        text = str(chat["messages"][-1].get("content"))
        if self.down or "poison" in text:
            raise RuntimeError("template crashed")
        if "slow" in text:  # a request made huge on purpose: slower than the attempt timeout
            await asyncio.sleep(1.0)
        return {"role": "assistant", "content": "fine"}


async def start(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim: Any,
    keys: bool,
    retry: str = "base_s: 0.01, cap_s: 0.02",
) -> TestServer:
    upstream = await aiohttp_server(sim.app())
    listed = f"""\
        keys:
          api_keys:
            - {{name: alice, key: {ALICE}}}
            - {{name: bob, key: {BOB}}}
        """
    path = tmp_path / "proxy.yaml"
    path.write_text(
        f"store: {{path: {tmp_path / 'state'}}}\n"
        + (textwrap.dedent(listed) if keys else "")
        + textwrap.dedent(
            f"""\
            model_list:
              - model_name: local
                litellm_params: {{model: openai/smollm2, api_base: "{upstream.make_url("/v1")}"}}
            policies:
              - name: p
                retry: {{{retry}}}
                circuit: {{failures: 3, cooldown_s: 30}}
            """
        )
    )
    return await start_proxy(path)


async def say(
    http: aiohttp.ClientSession, proxy: TestServer, key: str | None, text: str
) -> tuple[int, Any]:
    """One request in a session id never used before, as a hostile client would send."""
    body = {"model": "local", "messages": [{"role": "user", "content": text}]}
    headers = {"x-agentproxy-session": uuid.uuid4().hex}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    async with http.post(base_url(proxy) + "/chat/completions", json=body, headers=headers) as r:
        return r.status, await r.json()


async def test_one_keys_failures_in_fresh_sessions_do_not_open_the_circuit_for_another(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    upstream = Upstream()
    sim = LlamaCppSimulator(responder=upstream)
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, keys=True)
    async with aiohttp.ClientSession() as http:
        for _ in range(6):  # far past circuit.failures, each in a new session
            status, body = await say(http, proxy, BOB, "poison")
            assert status == 500, body
        calls = len(sim.requests)
        status, body = await say(http, proxy, ALICE, "hello")
        assert status == 200, body  # Alice's request reached the upstream
        assert len(sim.requests) == calls + 1
        # A real outage, seen by both keys (every tenant there is), opens it.
        upstream.down = True
        assert (await say(http, proxy, BOB, "hello"))[0] == 500
        calls = len(sim.requests)
        status, body = await say(http, proxy, ALICE, "hello")  # opens at its first failure
        assert status == 503 and body["error"]["code"] == "circuit_open", body
        assert len(sim.requests) == calls + 1
        status, body = await say(http, proxy, BOB, "hello")
        assert status == 503 and body["error"]["code"] == "circuit_open", body


async def test_one_keys_timeouts_do_not_open_the_circuit_for_another(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """A key can make its own requests time out (a huge prompt, a huge max_tokens): that is
    not the deployment's failure until another key sees it too."""
    sim = LlamaCppSimulator(responder=Upstream())
    retry = "attempts: 1, attempt_timeout_s: 0.2"
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, keys=True, retry=retry)
    async with aiohttp.ClientSession() as http:
        for _ in range(4):
            status, body = await say(http, proxy, BOB, "slow")
            assert status == 504, body
        status, body = await say(http, proxy, ALICE, "hello")
        assert status == 200, body


async def test_the_openai_sdk_of_another_key_gets_through_after_a_flood(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = LlamaCppSimulator(responder=Upstream())
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, keys=True)
    bob = openai.AsyncOpenAI(base_url=base_url(proxy), api_key=BOB, max_retries=0)
    for _ in range(5):
        with pytest.raises(openai.InternalServerError):
            await bob.chat.completions.create(
                model="local",
                messages=[{"role": "user", "content": "poison"}],
                extra_headers={"x-agentproxy-session": uuid.uuid4().hex},
            )
    alice = openai.AsyncOpenAI(base_url=base_url(proxy), api_key=ALICE, max_retries=0)
    reply = await alice.chat.completions.create(
        model="local", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == "fine"


async def test_without_keys_a_real_outage_still_opens_the_circuit(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    upstream = Upstream()
    sim = LlamaCppSimulator(responder=upstream)
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, keys=False)
    upstream.down = True
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            assert (await say(http, proxy, None, "hello"))[0] == 500
        status, body = await say(http, proxy, None, "hello")  # the third session opens it
        assert status == 503 and body["error"]["code"] == "circuit_open", body
