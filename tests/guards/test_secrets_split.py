"""A placeholder the model's answer splits across stream events (its text and its tool-call
arguments), given back whole, with the real SDKs over real sockets: a scripted upstream
(aiohttp) that records what it received and answers with every placeholder it was sent, cut
into three-character pieces. Also what the guard reports (header, metric) and dry-run."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory

KEY = "sk-proxy-split-1"
SECRET = "sk-ant-api03-" + "Q" * 40
FILE = f"ANTHROPIC_API_KEY={SECRET}\n"
PLACEHOLDER = re.compile(r"«secret:[0-9a-f]{12}»")


def pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


class Scripted:
    """Answers chat and Messages requests, streamed, with what it was sent echoed."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/messages", self.messages)
        return app

    def placeholder(self, raw: bytes) -> str:
        self.received.append(raw)
        found = PLACEHOLDER.search(raw.decode())
        return found.group(0) if found else "none"

    async def stream(self, request: web.Request, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(event)
        await response.write_eof()
        return response

    async def chat(self, request: web.Request) -> web.StreamResponse:
        said = self.placeholder(await request.read())
        body = orjson.loads(self.received[-1])

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            data = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
            return b"data: " + orjson.dumps({**data, "choices": [choice]}) + b"\n\n"

        arguments = orjson.dumps({"command": f"echo {said}"}).decode()
        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": p}) for p in pieces(f"the key is {said}.")]
        if body.get("tools"):
            head = {"index": 0, "id": "call_1", "type": "function"}
            events.append(chunk({"tool_calls": [{**head, "function": {"name": "bash"}}]}))
            events += [
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
                for p in pieces(arguments)
            ]
        events += [chunk({}, "tool_calls" if body.get("tools") else "stop"), b"data: [DONE]\n\n"]
        return await self.stream(request, events)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        said = self.placeholder(await request.read())

        def event(name: str, data: dict[str, Any]) -> bytes:
            return (
                f"event: {name}\ndata: ".encode() + orjson.dumps({"type": name, **data}) + b"\n\n"
            )

        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m"}
        message |= {
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 5, "output_tokens": 1},
        }
        delta = "content_block_delta"
        arguments = orjson.dumps({"command": f"echo {said}"}).decode()
        events = [event("message_start", {"message": message})]
        events.append(
            event(
                "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
            )
        )
        events += [
            event(delta, {"index": 0, "delta": {"type": "text_delta", "text": p}})
            for p in pieces(f"the key is {said}.")
        ]
        events.append(event("content_block_stop", {"index": 0}))
        use = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}
        events.append(event("content_block_start", {"index": 1, "content_block": use}))
        events += [
            event(delta, {"index": 1, "delta": {"type": "input_json_delta", "partial_json": p}})
            for p in pieces(arguments)
        ]
        events.append(event("content_block_stop", {"index": 1}))
        events.append(
            event(
                "message_delta",
                {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
            )
        )
        events.append(event("message_stop", {}))
        return await self.stream(request, events)


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, mode: str = "enforce"
) -> TestServer:
    url = str(upstream.make_url("")).rstrip("/")
    text = f"""\
        store: {{path: {tmp_path / "state"}}}
        keys:
          api_keys: [{{name: agent, key: {KEY}}}]
        model_list:
          - model_name: gpt-x
            litellm_params: {{model: openai/x, api_base: {url}/v1, api_key: sk-up}}
          - model_name: claude-x
            litellm_params: {{model: anthropic/x, api_base: {url}, api_key: sk-up}}
        policies:
          - name: guarded
            mode: {mode}
            guard: {{secrets: {{scrub: true}}}}
        """
    path = tmp_path / "split.yaml"
    path.write_text(textwrap.dedent(text))
    return await start_proxy(path)


TOOLS: Any = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


async def test_chat_stream_gives_back_a_placeholder_cut_into_pieces(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    scripted = Scripted()
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(scripted.app()))
    base = str(proxy.make_url("/v1"))
    sdk = openai.AsyncOpenAI(base_url=base, api_key=KEY)
    messages: Any = [{"role": "user", "content": f"my file:\n{FILE}"}]
    raw = await sdk.chat.completions.with_raw_response.create(
        model="gpt-x", messages=messages, tools=TOOLS, stream=True
    )
    text, arguments = "", ""
    async for chunk in raw.parse():
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                arguments += (call.function and call.function.arguments) or ""
    assert SECRET.encode() not in scripted.received[-1]
    assert text == f"the key is {SECRET}."
    assert orjson.loads(arguments) == {"command": f"echo {SECRET}"}
    assert "guard.scrub" in raw.headers["x-agentproxy-applied"]
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url("/metrics")) as response:
            metrics_text = await response.text()
    assert 'agentproxy_guard_total{action="scrub",rule="api_key"} 1.0' in metrics_text


async def test_anthropic_stream_gives_back_text_and_tool_input_cut_into_pieces(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    scripted = Scripted()
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(scripted.app()))
    sdk = anthropic.AsyncAnthropic(base_url=str(proxy.make_url("")).rstrip("/"), api_key=KEY)
    messages: Any = [{"role": "user", "content": f"my file:\n{FILE}"}]
    async with sdk.messages.stream(model="claude-x", max_tokens=64, messages=messages) as stream:
        message = await stream.get_final_message()
    assert SECRET.encode() not in scripted.received[-1]
    text, use = message.content
    assert text.type == "text" and text.text == f"the key is {SECRET}."
    assert use.type == "tool_use" and use.input == {"command": f"echo {SECRET}"}


@pytest.mark.parametrize("streamed", [False, True])
async def test_dry_run_reports_and_sends_as_it_came(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, streamed: bool
) -> None:
    scripted = Scripted()
    upstream = await aiohttp_server(scripted.app())
    proxy = await start(start_proxy, tmp_path, upstream, mode="dry_run")
    sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key=KEY)
    messages: Any = [{"role": "user", "content": f"my file:\n{FILE}"}]
    raw = await sdk.chat.completions.with_raw_response.create(
        model="gpt-x", messages=messages, stream=True
    )
    async for _ in raw.parse():
        pass
    assert SECRET.encode() in scripted.received[-1]
    assert "guard.would_scrub" in raw.headers["x-agentproxy-applied"]


async def test_a_scan_that_fails_sends_nothing(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail closed: a crashed stage is normally skipped, its input forwarded; this one's
    input holds the secrets, so the request is refused in the client's shape instead."""
    scripted = Scripted()
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(scripted.app()))

    def broken(self: Any, text: str) -> Any:
        raise RuntimeError(f"cannot scan {text}")

    monkeypatch.setattr("proxy.guards.secrets.patterns.SecretPatterns.find", broken)
    sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key=KEY, max_retries=0)
    messages: Any = [{"role": "user", "content": f"my file:\n{FILE}"}]
    with pytest.raises(openai.InternalServerError) as refused:
        await sdk.chat.completions.create(model="gpt-x", messages=messages, stream=True)
    assert refused.value.code == "guard_failed"
    assert scripted.received == []
