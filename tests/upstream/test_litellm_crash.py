"""A request that litellm's own translation cannot handle is the client's problem (400) or the
proxy's (500), never an upstream failure: it is not retried, does not count toward the
deployment's circuit, and its error body carries no traceback and no source path."""

from __future__ import annotations

import asyncio
import logging
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


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


# The classes of malformed fields the chat fuzz found reaching litellm's translation to
# Anthropic (each crashed it: a 500 `translation_failed`), and the field each 400 names.
MALFORMED: list[tuple[dict[str, Any], str]] = [
    ({"response_format": {"json_schema": {"name": "x"}}}, "response_format.type"),
    ({"response_format": {"type": ["text"]}}, "response_format.type"),
    ({"tools": [{"function": {"name": "x"}}]}, "tools[0].type"),
    ({"tools": [{"type": {"a": 1}, "function": {"name": "x"}}]}, "tools[0].type"),
    ({"stop": ["ok", ["nested"]]}, "stop[1]"),
    ({"stop": {"a": 1}}, "stop"),
    ({"messages": [{"role": "developer"}, user("hi")]}, "messages[0].content"),
    ({"messages": [user([[], {"type": "text"}])]}, "messages[0].content[0]"),
    ({"messages": [user([{"text": "no type"}])]}, "messages[0].content[0].type"),
    (
        {"messages": [user([{"type": "input_text", "text": "x"}])]},
        "messages[0].content[0].type",
    ),
    # Tools litellm checks itself (a ValueError) and cannot map to Anthropic.
    ({"tools": [{"type": "[[[", "function": {"name": "x"}}]}, "tools"),
    ({"tools": [{"type": "computer_20250124", "function": {"name": "c"}}]}, "tools"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param"), MALFORMED)
async def test_a_malformed_field_is_a_400_naming_it_not_a_translation_crash(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    fields: dict[str, Any],
    param: str,
) -> None:
    proxy, sim = await start(aiohttp_server, start_proxy, tmp_path)
    for stream in (False, True):
        status, raw = await chat(proxy, "sk-mallory", stream=stream, **fields)
        assert status == 400, raw
        assert_clean(raw)
        error = orjson.loads(raw)["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
        assert param in error["message"]
    assert sim.requests == []


async def test_a_crash_inside_litellm_is_the_proxys_500_and_opens_no_circuit(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Shapes the proxy does not check itself: litellm's translation raises (and calls it a
    connection error). The provider was never called. The log says so in one line: litellm's
    exception chain is three tracebacks, one request's worth of noise at INFO."""
    proxy, sim = await start(aiohttp_server, start_proxy, tmp_path)
    # A JSON schema format without its (optional) schema: litellm indexes it (KeyError).
    schemaless = {"type": "json_schema", "json_schema": {"name": "answer"}}
    caplog.set_level(logging.INFO, logger="agentproxy.litellm")
    for _ in range(2):
        status, raw = await chat(proxy, "sk-mallory", response_format=schemaless)
        assert status == 500, raw
        assert_clean(raw)
        assert orjson.loads(raw)["error"]["code"] == "translation_failed"
    assert sim.requests == []
    assert await upstream_errors(proxy) == 0  # litellm failed before any call
    status, raw = await chat(proxy, "sk-alice")
    assert status == 200, raw
    assert await circuit_state(proxy) == 0
    said = [r for r in caplog.records if r.name == "agentproxy.litellm" and "failed" in r.message]
    assert len(said) == 2
    for record in said:
        assert record.exc_info is None and "\n" not in record.getMessage(), record.getMessage()
        assert "KeyError" in record.getMessage()


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
