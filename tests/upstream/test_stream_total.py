"""server.stream_timeout_s: a stream that never falls silent (so read_timeout_s never fires)
still ends at its total time limit, with an error event in the client's wire format, and the
upstream connection is closed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from tests.conftest import ProxyFactory
from tests.upstream.hostile import Witness, content_event, send

KEY = "sk-upstream-key"


def endless_stream(witness: Witness, event: bytes, head: bytes = b"") -> Any:
    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        witness.requests += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            if head:
                await send(response, witness, head)
            while True:  # an event every 50 ms: never silent
                await send(response, witness, event)
                await asyncio.sleep(0.05)
        except (ConnectionError, asyncio.CancelledError):
            witness.stopped()
            raise

    return handle


ANTHROPIC_START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":'
    b'"message","role":"assistant","model":"m","content":[],"stop_reason":null,'
    b'"usage":{"input_tokens":3,"output_tokens":1}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
)
ANTHROPIC_DELTA = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"more "}}\n\n'
)


async def start(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, limit: str
) -> tuple[Any, Witness]:
    witness = Witness()
    app = web.Application()
    app.router.add_post(
        "/v1/chat/completions",
        endless_stream(witness, b"data: " + content_event("more ") + b"\n\n"),
    )
    app.router.add_post("/v1/messages", endless_stream(witness, ANTHROPIC_DELTA, ANTHROPIC_START))
    upstream = await aiohttp_server(app)
    url = str(upstream.make_url("")).rstrip("/")
    path = tmp_path / "c.yaml"
    path.write_text(
        f"""
server: {{stream_timeout_s: {limit}}}
store: {{path: {tmp_path}}}
model_list:
  - model_name: gpt
    litellm_params: {{model: openai/gpt, api_base: {url}/v1, api_key: {KEY}}}
  - model_name: claude
    litellm_params: {{model: anthropic/claude, api_base: {url}, api_key: {KEY}}}
"""
    )
    return await start_proxy(path), witness


async def stream(proxy: Any, route: str, model: str) -> tuple[int, bytes, float]:
    body = {
        "model": model,
        "max_tokens": 64,
        "stream": True,
        "messages": [{"role": "user", "content": "talk forever"}],
    }
    started = time.monotonic()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http,
        http.post(str(proxy.make_url(route)), json=body) as r,
    ):
        return r.status, await r.read(), time.monotonic() - started


async def test_a_chat_stream_ends_at_its_total_limit_with_an_error_event(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy, witness = await start(aiohttp_server, start_proxy, tmp_path, "1")
    status, raw, elapsed = await stream(proxy, "/v1/chat/completions", "gpt")
    assert status == 200, raw
    assert 0.9 < elapsed < 3
    events = raw.decode().strip().split("\n\n")
    assert events[0].startswith('data: {"id":"c"')  # the answer was relayed until then
    last = events[-1]
    assert last.startswith("data: ")
    error = orjson.loads(last[6:])["error"]
    assert error["code"] == "upstream_timeout"
    assert "server.stream_timeout_s (1s)" in error["message"]
    await asyncio.wait_for(witness.hung_up.wait(), 2)


async def test_an_anthropic_stream_ends_with_an_anthropic_error_event(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy, witness = await start(aiohttp_server, start_proxy, tmp_path, "1")
    status, raw, elapsed = await stream(proxy, "/v1/messages", "claude")
    assert status == 200, raw
    assert 0.9 < elapsed < 3
    last = raw.decode().strip().split("\n\n")[-1]
    assert last.startswith("event: error\ndata: ")
    error = orjson.loads(last.split("data: ", 1)[1])
    assert error["type"] == "error"
    assert "server.stream_timeout_s" in error["error"]["message"]
    await asyncio.wait_for(witness.hung_up.wait(), 2)


async def test_without_a_limit_a_talking_stream_runs_on(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy, witness = await start(aiohttp_server, start_proxy, tmp_path, "null")
    body = {"model": "gpt", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    async with (
        aiohttp.ClientSession() as http,
        http.post(str(proxy.make_url("/v1/chat/completions")), json=body) as r,
    ):
        assert r.status == 200
        await asyncio.sleep(1.5)
        assert not witness.hung_up.is_set()
        assert witness.sent > 0
