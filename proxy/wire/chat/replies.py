"""OpenAI Chat Completions: reading a reply, taking the proxy's own calls out of it, and the
error bodies a client of this format reads."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.guards.tool_rules import Verdict
from proxy.messages import Message
from proxy.upstream.base import UpstreamHTTPError, UpstreamReply


def reply_message(reply: UpstreamReply) -> Message:
    """The assistant message of a completion (its first choice)."""
    choices = reply.data.get("choices") or [{}]
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    return message if isinstance(message, dict) else {}


def without_recall(reply: UpstreamReply, theirs: list[dict[str, Any]]) -> UpstreamReply:
    """The client never sees a call to the proxy's own tool: only its own calls are left."""
    choice = reply.data["choices"][0]
    if theirs:
        choice["message"]["tool_calls"] = theirs
    else:
        choice["message"].pop("tool_calls", None)
        choice["finish_reason"] = "stop"
    return UpstreamReply(reply.data, orjson.dumps(reply.data), reply.headers)


def refused(reply: UpstreamReply, verdict: Verdict) -> UpstreamReply:
    """The guard's denied calls taken out, its text added to the answer's; with no call left
    the answer ends as a plain one ("stop"), so the agent's loop goes on."""
    choice = reply.data["choices"][0]
    message = choice["message"]
    kept = [c for i, c in enumerate(message.get("tool_calls") or []) if i not in verdict.denied]
    message["content"] = joined(message.get("content"), verdict.text)
    if kept:
        message["tool_calls"] = kept
    else:
        message.pop("tool_calls", None)
        choice["finish_reason"] = "stop"
    return UpstreamReply(reply.data, orjson.dumps(reply.data), reply.headers)


def joined(text: object, said: str) -> str:
    """The answer's text with the guard's after it."""
    return f"{text}\n\n{said}" if isinstance(text, str) and text else said


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
        parsed = {
            "error": {
                "message": error.plain_message(),
                "type": "upstream_error",
                "param": None,
                "code": "upstream_http_error",
                "request_id": request_id,
            }
        }
    parsed["error"].update(error.extra)
    return orjson.dumps(parsed)
