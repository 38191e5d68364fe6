"""A recorded stream's answer, assembled: the same answer records as before for every wire, and
a long stream (128k events) assembled without holding the event loop (/healthz, polled over a
real socket meanwhile, stays fast) in all three wires."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.recording.answers import answer_of
from proxy.state import RECORDINGS
from proxy.wire.anthropic.wire import ANTHROPIC
from proxy.wire.chat.wire import CHAT
from proxy.wire.responses.wire import RESPONSES
from tests.conftest import ProxyFactory
from tests.recording.test_recording import ALICE, config, session, turns_of

EVENTS = 128_000
PER_WRITE = 250  # events the upstream writes at once (a fast upstream's reads)
WORST_HEALTHZ_S = 1.0  # main: 1.6 to 8.7 s; one loop runs upstream, proxy and client here,
# and a loaded machine has cost 0.5 s (bench/attack_stream.py measures the proxy alone: ~50 ms)
PAUSE_S = 0.005


def _sse(event: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + orjson.dumps(event) + b"\n\n"


def piece(n: int) -> str:
    return f"w{n} "


def chat_events(count: int) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _sse({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                     "model": "sim", "choices": [choice]})  # fmt: skip

    usage = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "sim",
             "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": count,
                                      "total_tokens": count + 3}}  # fmt: skip
    return [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": piece(n)}) for n in range(count)),
        chunk({}, "stop"),
        _sse(usage),
        b"data: [DONE]\n\n",
    ]


def anthropic_events(count: int) -> list[bytes]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sim",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    text = {"type": "text", "text": ""}
    end = {"stop_reason": "end_turn", "stop_sequence": None}

    def delta(n: int) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta",
                "text": piece(n)}}  # fmt: skip

    events = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": text},
        *(delta(n) for n in range(count)),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": end, "usage": {"output_tokens": count}},
        {"type": "message_stop"},
    ]
    return [_sse(event, event["type"]) for event in events]


def responses_events(count: int) -> list[bytes]:
    base = {"id": "resp_1", "object": "response", "created_at": 1, "model": "sim",
            "status": "in_progress", "output": []}  # fmt: skip
    text = "".join(piece(n) for n in range(count))
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
            "content": [part]}  # fmt: skip
    usage = {"input_tokens": 3, "output_tokens": count, "total_tokens": count + 3}
    done = {**base, "status": "completed", "output": [item], "usage": usage}

    def delta(n: int) -> dict[str, Any]:
        at = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
        return {"type": "response.output_text.delta", "sequence_number": n + 1, **at,
                "delta": piece(n)}  # fmt: skip

    events = [
        {"type": "response.created", "sequence_number": 0, "response": base},
        *(delta(n) for n in range(count)),
        {"type": "response.completed", "sequence_number": count + 1, "response": done},
    ]
    return [_sse(event, event["type"]) for event in events]


WIRES = {
    "chat": ("/v1/chat/completions", chat_events, "sim"),
    "anthropic": ("/v1/messages", anthropic_events, "claude"),
    "responses": ("/v1/responses", responses_events, "sim"),
}


def upstream_app(count: int) -> web.Application:
    async def stream(request: web.Request, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for at in range(0, len(events), PER_WRITE):
            await response.write(b"".join(events[at : at + PER_WRITE]))
        await response.write_eof()
        return response

    app = web.Application()
    for path, events_of, _ in WIRES.values():
        events = events_of(count)

        async def handler(request: web.Request, events: list[bytes] = events) -> Any:
            return await stream(request, events)

        app.router.add_post(path, handler)
    return app


def request_of(wire: str, model: str) -> tuple[dict[str, Any], dict[str, str]]:
    user = {"role": "user", "content": "talk a lot"}
    if wire == "responses":
        return {"model": model, "input": [user], "stream": True}, {}
    if wire == "anthropic":
        body = {"model": model, "max_tokens": 10, "messages": [user], "stream": True}
        return body, {"x-api-key": ALICE, "anthropic-version": "2023-06-01"}
    return {"model": model, "messages": [user], "stream": True}, {}


async def worst_healthz(
    proxy: TestServer, http: aiohttp.ClientSession, done: asyncio.Event
) -> float:
    """The longest a /healthz answer was waited for while `done` is not set, polled every 5 ms:
    the time from one answer to the next, less the pause between them (a stall that began
    during the pause counts too)."""
    worst = 0.0
    url = str(proxy.make_url("/healthz"))
    last = time.perf_counter()
    while not done.is_set():
        await asyncio.sleep(PAUSE_S)
        async with http.get(url) as response:
            await response.read()
            assert response.status == 200
        now = time.perf_counter()
        worst, last = max(worst, now - last - PAUSE_S), now
    return worst


@pytest.mark.parametrize("wire", list(WIRES))
async def test_a_long_stream_is_recorded_without_holding_the_loop(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, wire: str
) -> None:
    upstream: TestServer = await aiohttp_server(upstream_app(EVENTS))
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), f"path: {tmp_path / 'data'}"))
    proxy = await start_proxy(path)
    route, _, model = WIRES[wire]
    body, headers = request_of(wire, model)
    done = asyncio.Event()
    async with aiohttp.ClientSession() as http:
        poll = asyncio.create_task(worst_healthz(proxy, http, done))
        async with http.post(
            str(proxy.make_url(route)),
            json=body,
            headers={"authorization": f"Bearer {ALICE}", **headers, **session("long")},
        ) as response:
            assert response.status == 200
            got = await response.read()
        await proxy.app[RECORDINGS].flush()
        done.set()
        worst = await poll
    assert got.count(b"w127999 ") >= 1  # the client got all of it
    (turn,) = await turns_of(proxy, "key:alice", "long")
    text = "".join(piece(n) for n in range(EVENTS))
    answer = turn["answer"]
    if wire == "chat":
        assert answer["choices"][0]["message"]["content"] == text
    elif wire == "anthropic":
        assert answer["content"] == [{"type": "text", "text": text}]
    else:
        assert answer["output"][0]["content"][0]["text"] == text
    assert worst < WORST_HEALTHZ_S, f"/healthz took {worst:.3f} s while the stream was recorded"


def test_every_wire_assembles_its_stream_into_the_answer_it_stands_for() -> None:
    text = "".join(piece(n) for n in range(50))
    chat = answer_of(CHAT.answer_assembly, None, chat_events(50))
    assert chat["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    ]
    assert chat["usage"]["completion_tokens"] == 50
    anthropic = answer_of(ANTHROPIC.answer_assembly, None, anthropic_events(50))
    assert anthropic["content"] == [{"type": "text", "text": text}]
    assert anthropic["stop_reason"] == "end_turn" and anthropic["usage"]["output_tokens"] == 50
    responses = answer_of(RESPONSES.answer_assembly, None, responses_events(50))
    assert responses["status"] == "completed"
    # An event split across writes, and a stream sent whole as a body, read the same.
    joined = b"".join(chat_events(50))
    assert answer_of(CHAT.answer_assembly, None, [joined[:1001], joined[1001:]]) == chat
    assert answer_of(CHAT.answer_assembly, joined, None) == chat


def test_tool_calls_and_partial_json_are_joined_from_their_pieces() -> None:
    def chunk(delta: dict[str, Any]) -> bytes:
        return _sse({"id": "c", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": delta}]})  # fmt: skip

    calls = [
        chunk({"role": "assistant", "tool_calls": [
            {"index": 0, "id": "call_1", "function": {"name": "rea", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"name": "d", "arguments": '{"a"'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        chunk({"reasoning_content": "hm"}),
        chunk({"reasoning_content": "m"}),
    ]  # fmt: skip
    message = answer_of(CHAT.answer_assembly, None, calls)["choices"][0]["message"]
    assert message["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"a": 1}'}}
    ]
    assert message["reasoning_content"] == "hmm"
    start = {"type": "message_start", "message": {"id": "m", "content": []}}
    tool = {"type": "content_block_start", "index": 0,
            "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}}  # fmt: skip
    pieces = [
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "input_json_delta", "partial_json": part}}
        for part in ('{"x": ', '[1, 2', "]}")
    ]  # fmt: skip
    anthropic = answer_of(
        ANTHROPIC.answer_assembly, None, [_sse(e) for e in (start, tool, *pieces)]
    )
    assert anthropic["content"] == [
        {"type": "tool_use", "id": "t", "name": "f", "input": {"x": [1, 2]}}
    ]
