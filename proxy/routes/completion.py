"""Serving one chat completion upstream: the model calls and the recall rounds.

Each model call goes through control (proxy/control): fallback ⊃ retry ⊃ fit-to-context ⊃
upstream call. A stream is retried only until it opens: once bytes reached the client, a
failure ends the stream with an error event. A model that calls the proxy's recall tool gets
its answer and is called again, a bounded number of rounds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from proxy.errors import ProxyError
from proxy.exchange import Exchange
from proxy.middleware import CLIENT_GONE
from proxy.pipeline import recall
from proxy.pipeline.base import record
from proxy.routes.relay import Relay
from proxy.state import CONTROL, REWRITER, STORE
from proxy.upstream.base import UpstreamHTTPError, UpstreamReply, UpstreamStream

Headers = Callable[[], dict[str, str]]


async def complete(request: web.Request, ex: Exchange, headers: Headers) -> web.Response:
    reply: UpstreamReply = await _call(request, ex, stream=False)
    rounds = ex.policy.recall.max_rounds
    for round_ in range(rounds + 1):
        message = _first_message(reply.data)
        ours, theirs = recall.split_calls(message)
        if not ours:
            break
        if theirs or round_ == rounds:
            reply = _without_recall(reply, theirs)
            break
        await _answer_recall(request, ex, message, ours, last=round_ + 1 == rounds)
        reply = await _call(request, ex, stream=False)
    return web.Response(
        body=reply.body,
        content_type="application/json",
        headers={**reply.headers, **headers(), "server-timing": server_timing(ex)},
    )


async def stream(request: web.Request, ex: Exchange, headers: Headers) -> web.StreamResponse:
    source: UpstreamStream = await _call(request, ex, stream=True)
    response = web.StreamResponse(
        headers={
            **source.headers,
            **headers(),
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "x-request-id": ex.request_id,
        }
    )
    relay = Relay(request, ex, response)
    relay.hold_tool_calls = recall.offered(ex.body)
    rounds = ex.policy.recall.max_rounds
    try:
        for round_ in range(rounds + 1):
            try:
                held = await relay.run(source, lambda: server_timing(ex))
            finally:
                await source.close()
            if held is None:
                break
            message = held.message()
            ours, theirs = recall.split_calls(message)
            if not ours or theirs or round_ == rounds:
                rest = b"".join(held.without_recall()) + b"data: [DONE]\n\n"
                await relay.write(rest, server_timing(ex))
                break
            await _answer_recall(request, ex, message, ours, last=round_ + 1 == rounds)
            source = await _call(request, ex, stream=True)
    except ProxyError as error:
        if not response.prepared:
            raise
        await _write_error_event(ex, response, error.message, error.body(ex.request_id))
    except UpstreamHTTPError as error:  # a later recall round failed
        if not response.prepared:
            raise
        said = f"upstream answered HTTP {error.status} after the stream began"
        await _write_error_event(ex, response, said, passthrough_body(error, ex.request_id))
    except ConnectionResetError:
        request[CLIENT_GONE] = True
        return response
    try:
        await response.write_eof()
    except ConnectionResetError:
        request[CLIENT_GONE] = True
    return response


async def _call(request: web.Request, ex: Exchange, *, stream: bool) -> Any:
    """One model call, under control: fallback ⊃ retry ⊃ fit-to-context ⊃ upstream call."""
    return await request.app[CONTROL].call(ex, stream=stream)


async def _answer_recall(
    request: web.Request,
    ex: Exchange,
    message: dict[str, Any],
    calls: list[dict[str, Any]],
    *,
    last: bool,
) -> None:
    """Answer the model's recall calls and extend the history for the next call. The last
    allowed round goes out without the tool, so the model has to answer."""
    answers = await recall.answer(ex, calls, request.app[STORE])
    turn = {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
    ex.body["messages"] = [*ex.messages, turn, *answers]
    if last:
        recall.withdraw(ex.body)
    record(ex, request.app[REWRITER].ctx, "recall", "answered", count=len(calls))


def _first_message(data: dict[str, Any]) -> dict[str, Any]:
    choices = data.get("choices") or [{}]
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    return message if isinstance(message, dict) else {}


def _without_recall(reply: UpstreamReply, theirs: list[dict[str, Any]]) -> UpstreamReply:
    """The client never sees a call to the proxy's own tool."""
    choice = reply.data["choices"][0]
    if theirs:
        choice["message"]["tool_calls"] = theirs
    else:
        choice["message"].pop("tool_calls", None)
        choice["finish_reason"] = "stop"
    return UpstreamReply(reply.data, orjson.dumps(reply.data), reply.headers)


async def _write_error_event(
    ex: Exchange, response: web.StreamResponse, message: str, body: Any
) -> None:
    """Bytes already reached the client: end the stream with an error event it can read."""
    ex.note("stream", "error", message=message)
    with contextlib.suppress(ConnectionResetError):
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        await response.write(b"data: " + data + b"\n\n")


def passthrough_body(error: UpstreamHTTPError, request_id: str) -> bytes:
    """A provider's error as the client gets it: its JSON unchanged, or (non-JSON) wrapped in
    an OpenAI-style body; with what recovery tried (error.extra) added to the error object."""
    try:
        parsed = orjson.loads(error.body)
    except orjson.JSONDecodeError:
        parsed = None
    else:
        if not error.extra:
            return error.body
    if not isinstance(parsed, dict) or not isinstance(parsed.get("error"), dict):
        text = error.body[:500].decode("utf-8", "replace").strip() or "(empty body)"
        parsed = {
            "error": {
                "message": f"upstream answered HTTP {error.status}: {text}",
                "type": "upstream_error",
                "param": None,
                "code": "upstream_http_error",
                "request_id": request_id,
            }
        }
    parsed["error"].update(error.extra)
    return orjson.dumps(parsed)


def server_timing(ex: Exchange) -> str:
    return f"proxy;dur={ex.overhead() * 1000:.3f}, upstream;dur={ex.upstream_wait * 1000:.3f}"
