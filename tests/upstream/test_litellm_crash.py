"""A request that litellm's own translation cannot handle is the client's problem (400) or the
proxy's (500), never an upstream failure: it is not retried, does not count toward the
deployment's circuit, and its error body carries no traceback and no source path."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory

KEY = "sk-ant-sim-secret-key"
BAD_TOOLS = [{"type": "function", "function": {"name": "x", "parameters": "oops"}}]


async def start(aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path) -> Any:
    sim = Simulator(api_key=KEY)
    upstream = await aiohttp_server(sim.app())
    path = tmp_path / "c.yaml"
    path.write_text(
        f"""
store: {{path: {tmp_path}}}
keys:
  api_keys:
    - {{name: mallory, key: sk-mallory}}
    - {{name: alice, key: sk-alice}}
model_list:
  - model_name: claude
    litellm_params:
      model: anthropic/claude-sim
      api_base: {str(upstream.make_url("")).rstrip("/")}
      api_key: {KEY}
      max_tokens: 256
policies:
  - name: strict-circuit
    circuit: {{failures: 2, cooldown_s: 30}}
"""
    )
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession() as http:
        for _ in range(600):  # litellm is imported in the background; /readyz says when
            async with http.get(str(proxy.make_url("/readyz"))) as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.05)
    return proxy, sim


async def chat(proxy: Any, key: str, **fields: Any) -> tuple[int, bytes]:
    body = {"model": "claude", "messages": [{"role": "user", "content": "hi"}], **fields}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.post(
            str(proxy.make_url("/v1/chat/completions")),
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        ) as r,
    ):
        return r.status, await r.read()


def assert_clean(raw: bytes) -> None:
    assert b"Traceback" not in raw
    assert b".py" not in raw
    assert b'File "' not in raw


async def circuit_state(proxy: Any) -> float:
    async with aiohttp.ClientSession() as http, http.get(str(proxy.make_url("/metrics"))) as r:
        text = await r.text()
    found = re.search(r'agentproxy_circuit_state\{deployment="claude[^"]*"\} (\S+)', text)
    return float(found.group(1)) if found else 0.0


async def upstream_errors(proxy: Any) -> float:
    """agentproxy_upstream_errors_total over every model and reason."""
    async with aiohttp.ClientSession() as http, http.get(str(proxy.make_url("/metrics"))) as r:
        text = await r.text()
    found = re.findall(r"^agentproxy_upstream_errors_total\{[^}]*\} (\S+)$", text, re.M)
    return sum(float(value) for value in found)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_string_tool_schema_is_a_400_naming_the_field(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, stream: bool
) -> None:
    proxy, sim = await start(aiohttp_server, start_proxy, tmp_path)
    for _ in range(4):
        status, raw = await chat(proxy, "sk-mallory", tools=BAD_TOOLS, stream=stream)
        assert status == 400, raw
        assert_clean(raw)
        error = orjson.loads(raw)["error"]
        assert error["param"] == "tools[0].function.parameters"
        assert "must be an object, not a string" in error["message"]
    assert sim.requests == []
    assert await upstream_errors(proxy) == 0  # the proxy refused it: no upstream failed
    status, raw = await chat(proxy, "sk-alice", stream=stream)
    assert status == 200, raw
    assert await circuit_state(proxy) == 0
    assert len(sim.requests) == 1


async def test_a_crash_inside_litellm_is_the_proxys_500_and_opens_no_circuit(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """Shapes the proxy does not check itself: litellm's translation raises (and calls it a
    connection error). The provider was never called."""
    proxy, sim = await start(aiohttp_server, start_proxy, tmp_path)
    crashers: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": [{"text": "no type"}]}]},
        {"response_format": "oops"},
    ]
    for fields in crashers * 2:
        status, raw = await chat(proxy, "sk-mallory", **fields)
        assert status in (400, 500), raw
        assert_clean(raw)
        assert orjson.loads(raw)["error"]["code"] != "upstream_unreachable"
    assert sim.requests == []
    assert await upstream_errors(proxy) == 0  # litellm failed before any call
    status, raw = await chat(proxy, "sk-alice")
    assert status == 200, raw
    assert await circuit_state(proxy) == 0


@pytest.mark.parametrize("answer", [b"not json at all", b'{"type": "message", "content": "x"}'])
async def test_a_garbled_provider_answer_is_still_the_upstreams_failure(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, answer: bytes
) -> None:
    """litellm raises the same kind of error reading a garbled answer as translating a bad
    request; this one the provider sent, so it stays a 502 that counts toward the circuit."""
    calls = 0

    async def garbled(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.Response(body=answer, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/messages", garbled)
    upstream = await aiohttp_server(app)
    path = tmp_path / "c.yaml"
    path.write_text(
        f"""
store: {{path: {tmp_path}}}
model_list:
  - model_name: claude
    litellm_params:
      model: anthropic/claude-sim
      api_base: {str(upstream.make_url("")).rstrip("/")}
      api_key: {KEY}
policies:
  - name: strict-circuit
    retry: {{attempts: 1}}
    circuit: {{failures: 2, cooldown_s: 30}}
"""
    )
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession() as http:
        for _ in range(600):
            async with http.get(str(proxy.make_url("/readyz"))) as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.05)
    for _ in range(2):
        status, raw = await chat(proxy, "unused")
        assert status == 502, raw
        assert_clean(raw)
        assert orjson.loads(raw)["error"]["code"] == "upstream_unreachable"
    assert calls == 2
    assert await circuit_state(proxy) == 2  # open: the provider is what failed
    assert await upstream_errors(proxy) == 2  # and counted as the upstream's failures
