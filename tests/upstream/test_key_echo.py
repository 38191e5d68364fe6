"""A provider that echoes the key it was given in a 200 answer: the key never reaches the
client, whole or streamed, on the fast path, the native Anthropic path and through litellm.
The echoing upstream sends the key split across two writes, inside one SSE event."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory

KEY = "sk-operator-echoed-secret-0123456789"


def _key_of(request: web.Request) -> str:
    bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
    return request.headers.get("x-api-key") or bearer


async def _send_split(response: web.StreamResponse, data: bytes, key: str) -> None:
    """`data` in two writes, cut in the middle of the key."""
    cut = data.index(key.encode()) + len(key) // 2
    await response.write(data[:cut])
    await asyncio.sleep(0.02)
    await response.write(data[cut:])


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    key = _key_of(request)
    text = f"your key is {key}"
    if not body.get("stream"):
        return web.json_response(
            {"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
             "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                          "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}
        )  # fmt: skip
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
    await _send_split(response, b"data: " + orjson.dumps(chunk) + b"\n\n", key)
    await response.write(b"data: [DONE]\n\n")
    return response


async def messages(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    key = _key_of(request)
    text = f"your key is {key}"
    usage = {"input_tokens": 3, "output_tokens": 5}
    if not body.get("stream"):
        return web.json_response(
            {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
             "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
             "stop_sequence": None, "usage": usage}
        )  # fmt: skip
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)

    def event(kind: str, data: dict[str, Any]) -> bytes:
        return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **data}) + b"\n\n"

    start = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
             "stop_reason": None, "stop_sequence": None, "usage": usage}  # fmt: skip
    await response.write(event("message_start", {"message": start}))
    block = {"index": 0, "content_block": {"type": "text", "text": ""}}
    await response.write(event("content_block_start", block))
    delta = {"index": 0, "delta": {"type": "text_delta", "text": text}}
    await _send_split(response, event("content_block_delta", delta), key)
    await response.write(event("content_block_stop", {"index": 0}))
    stop = {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": usage}
    await response.write(event("message_delta", stop))
    await response.write(event("message_stop", {}))
    return response


@pytest.fixture
async def proxy(aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path) -> TestServer:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/messages", messages)
    upstream = await aiohttp_server(app)
    url = str(upstream.make_url("")).rstrip("/")
    path = tmp_path / "c.yaml"
    path.write_text(
        f"""
store: {{path: {tmp_path}}}
model_list:
  - model_name: gpt
    litellm_params: {{model: openai/gpt, api_base: {url}/v1, api_key: {KEY}}}
  - model_name: claude
    litellm_params: {{model: anthropic/claude, api_base: {url}, api_key: {KEY}}}
"""
    )
    server = await start_proxy(path)
    async with aiohttp.ClientSession() as http:
        for _ in range(600):  # litellm is imported in the background; /readyz says when
            async with http.get(str(server.make_url("/readyz"))) as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.05)
    return server


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("route", "model"),
    [
        ("/v1/chat/completions", "gpt"),  # the fast path
        ("/v1/chat/completions", "claude"),  # litellm
        ("/v1/messages", "claude"),  # Anthropic natively
    ],
)
async def test_an_echoed_key_is_redacted(
    proxy: TestServer, route: str, model: str, stream: bool
) -> None:
    body = {
        "model": model,
        "max_tokens": 64,
        "stream": stream,
        "messages": [{"role": "user", "content": "what is your key?"}],
    }
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.post(str(proxy.make_url(route)), json=body) as r,
    ):
        status, raw = r.status, await r.read()
    assert status == 200, raw
    assert KEY.encode() not in raw
    assert KEY[: len(KEY) // 2].encode() not in raw
    assert b"your key is [redacted]" in raw
