"""Redis going away mid-session: requests go on statelessly, budgets fail open or closed as
their policy says, nothing crashes, and everything works again once Redis is back."""

from __future__ import annotations

import asyncio
import re
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import OwnRedis, ProxyFactory, sim_config, start_redis

BIG = "".join(f"row {n}: value {n * 7}\n" for n in range(2_000))  # ~10k tokens: offloaded


def config(sim_url: str, port: int) -> str:
    return sim_config(
        sim_url,
        textwrap.dedent(
            f"""\
            store: {{backend: redis, url: "redis://127.0.0.1:{port}/0", prefix: "outage:",
                     timeout_s: 0.2}}
            policies:
              - name: strict
                match: {{headers: {{x-budget: strict}}}}
                budgets: [{{name: strict, limits: {{calls: 100}}, on_store_error: refuse}}]
              - name: lenient
                offload: {{min_tokens: 2000}}
                budgets: [{{name: lenient, limits: {{calls: 100}}}}]
            """
        ),
        window=100_000,
    )


def turn(index: int) -> list[dict[str, Any]]:
    call = {"id": f"c{index}", "type": "function",
            "function": {"name": "read_file", "arguments": f'{{"path": "f{index}"}}'}}  # fmt: skip
    return [
        {"role": "user", "content": "read the files"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{index}", "content": f"file {index}\n{BIG}"},
    ]


async def ask(server: TestServer, index: int, strict: bool = False) -> tuple[int, str, Any]:
    headers = {"x-agentproxy-session": f"s{index}"}
    if strict:
        headers["x-budget"] = "strict"
    body = {"model": "sim", "messages": turn(index)}
    async with aiohttp.ClientSession() as http:
        async with http.post(server.make_url("/v1/chat/completions"), json=body,
                             headers=headers) as response:  # fmt: skip
            return (
                response.status,
                response.headers.get("x-agentproxy-applied", ""),
                await response.json(),
            )


async def test_requests_go_on_without_redis_and_recover(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, own_redis: OwnRedis
) -> None:
    port, processes = own_redis
    start_redis(port, processes)
    sim = Simulator(context_window=100_000)
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), port))
    proxy = await start_proxy(path)

    status, applied, _ = await _when_up(proxy)
    assert status == 200 and "offload.offloaded" in applied

    processes[0].terminate()
    processes[0].wait(5)
    status, applied, _ = await ask(proxy, 2)
    # Stateless: the result stays in the request (nothing could be stored), the budget is
    # let through unchecked (policy default), and the client gets its answer.
    assert status == 200
    assert "offload.store_failed" in applied and "budget.unchecked" in applied
    assert BIG in str(sim.requests[-1].body["messages"][-1]["content"])
    status, _, body = await ask(proxy, 3, strict=True)
    assert status == 503 and body["error"]["type"] == "budget_unavailable"
    assert "on_store_error: refuse" in body["error"]["message"]

    start_redis(port, processes)
    status, applied, _ = await _when_up(proxy, first=4)
    assert status == 200 and "offload.offloaded" in applied
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url("/metrics")) as response:
            metrics = await response.text()
    assert 'agentproxy_store_errors_total{backend="redis",operation="put"}' in metrics
    unchecked = re.search(
        r'agentproxy_decisions_total\{action="unchecked",guard="budget"\} (\S+)', metrics
    )
    assert unchecked is not None and float(unchecked.group(1)) >= 1


async def _when_up(proxy: TestServer, first: int = 1) -> tuple[int, str, Any]:
    """Ask until a request finds Redis answering again (it pauses a second after failures)."""
    for index in range(first, first + 50):
        status, applied, body = await ask(proxy, index)
        if "store_failed" not in applied and "unchecked" not in applied:
            return status, applied, body
        await asyncio.sleep(0.1)
    raise AssertionError("the proxy never found Redis again")
