"""Degraded answers in Chat Completions form: when every recovery failed and the policy asks
for it (Flow.degrades), the client gets a normal completion that says the model is unavailable,
so an agent loop keeps going instead of crashing. Marked `x-agentproxy-degraded: true`."""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from proxy.exchange import Exchange
from proxy.upstream.base import UpstreamHTTPError

TEXT = (
    "[agentproxy] The model is unavailable right now ({reason}), so this step was not done. "
    "Tried: {tried}. Wait and retry this step, or carry on without the model."
)


def degraded_text(ex: Exchange, error: Exception) -> str:
    """What a degraded answer says, in every wire format: why, and what was tried."""
    reason = (
        f"upstream answered {error.status}"
        if isinstance(error, UpstreamHTTPError)
        else getattr(error, "code", None) or type(error).__name__
    )
    tried = ", ".join(ex.recovery.recoveries()) or "one attempt"
    return TEXT.format(reason=reason, tried=tried)


def answer(ex: Exchange, error: Exception, headers: dict[str, str]) -> web.Response:
    text = degraded_text(ex, error)
    headers = {**headers, "x-agentproxy-degraded": "true"}
    meta = {
        "id": f"chatcmpl-agentproxy-{ex.identity.request_id}",
        "created": int(time.time()),
        "model": ex.alias,
    }
    if ex.client.stream:
        return web.Response(
            body=_stream(meta, text, ex.client.wants_usage),
            content_type="text/event-stream",
            headers=headers,
        )
    body = {
        **meta,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
    return web.Response(body=orjson.dumps(body), content_type="application/json", headers=headers)


def _stream(meta: dict[str, object], text: str, with_usage: bool) -> bytes:
    chunk = {**meta, "object": "chat.completion.chunk"}
    events = [
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    if with_usage:
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        events.append({**chunk, "choices": [], "usage": usage})
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
