"""Anthropic Messages: reading a reply (native, or a translated chat completion), taking the
proxy's own calls out of it, and the error envelope an Anthropic client reads."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.errors import ProxyError
from proxy.guards.tool_rules import Verdict
from proxy.messages import Message
from proxy.pipeline import recall
from proxy.upstream.base import UpstreamHTTPError, UpstreamReply
from proxy.wire import translate
from proxy.wire.anthropic.view import AnthropicView, assistant_message
from proxy.wire.chat import replies as chat

# The error types of Anthropic's envelope, by status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def error_type(status: int) -> str:
    fallback = "api_error" if status >= 500 else "invalid_request_error"
    return ERROR_TYPES.get(status, fallback)


def error_body(error: ProxyError, request_id: str | None) -> dict[str, Any]:
    """A proxy error in Anthropic's envelope; the proxy's own code and details ride along."""
    inner: dict[str, Any] = {"type": error_type(error.status), "message": error.message}
    if error.code:
        inner["code"] = error.code
    extra = error.body(None)["error"]
    if isinstance(extra, dict):
        skip = ("message", "type", "param")
        inner.update({k: v for k, v in extra.items() if k not in skip and v is not None})
    body: dict[str, Any] = {"type": "error", "error": inner}
    if request_id:
        body["request_id"] = request_id
    return body


def passthrough_body(error: UpstreamHTTPError, request_id: str) -> bytes:
    """A provider's error in Anthropic's envelope: an Anthropic provider's unchanged, an
    OpenAI-shaped one (a translated call) or a non-JSON one rewrapped; with what recovery
    tried added."""
    try:
        parsed = orjson.loads(error.body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("type") == "error":
        if not error.extra:
            return error.body
        if isinstance(parsed.get("error"), dict):
            parsed["error"].update(error.extra)
            return orjson.dumps(parsed)
    inner = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        message = inner["message"]
    else:
        message = error.plain_message()
    body = {
        "type": "error",
        "error": {"type": error_type(error.status), "message": message, **error.extra},
        "request_id": request_id,
    }
    return orjson.dumps(body)


class Replies:
    """Reads replies for one Anthropic exchange (Flow's `Replies`)."""

    def __init__(self, view: AnthropicView) -> None:
        self.view = view

    def reply_message(self, reply: UpstreamReply) -> Message:
        if "choices" in reply.data:  # a translated call's chat completion
            return chat.reply_message(reply)
        content = [b for b in reply.data.get("content") or [] if isinstance(b, dict)]
        self.view.remember_turn(content)  # continued by a recall round: sent back whole
        return assistant_message(content)

    def without_recall(self, reply: UpstreamReply, theirs: list[dict[str, Any]]) -> UpstreamReply:
        if "choices" in reply.data:
            return chat.without_recall(reply, theirs)
        data = reply.data
        data["content"] = [
            b
            for b in data.get("content") or []
            if not (b.get("type") == "tool_use" and b.get("name") == recall.TOOL_NAME)
        ]
        if not theirs:
            data["stop_reason"] = "end_turn"
        return UpstreamReply(data, orjson.dumps(data), reply.headers)

    def refused(self, reply: UpstreamReply, verdict: Verdict) -> UpstreamReply:
        """The denied tool_use blocks taken out, the guard's text as a text block after the
        rest; with no tool_use left the message ends its turn (end_turn, not tool_use)."""
        if "choices" in reply.data:
            return chat.refused(reply, verdict)
        data = reply.data
        blocks = [b for b in data.get("content") or [] if isinstance(b, dict)]
        data["content"] = [*without_denied(blocks, verdict), text_block(verdict.text)]
        if not any(b.get("type") == "tool_use" for b in data["content"]):
            data["stop_reason"] = "end_turn"
        return UpstreamReply(data, orjson.dumps(data), reply.headers)


def denied_indexes(blocks: dict[int, dict[str, Any]], verdict: Verdict) -> set[int]:
    """The indexes of the blocks the guard denied: its positions count the client's calls
    (tool_use blocks, the proxy's own left out) in order."""
    theirs = [
        i
        for i in sorted(blocks)
        if blocks[i].get("type") == "tool_use" and blocks[i].get("name") != recall.TOOL_NAME
    ]
    return {theirs[p] for p in verdict.denied if p < len(theirs)}


def without_denied(blocks: list[dict[str, Any]], verdict: Verdict) -> list[dict[str, Any]]:
    denied = denied_indexes(dict(enumerate(blocks)), verdict)
    return [b for i, b in enumerate(blocks) if i not in denied]


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def client_message(reply: UpstreamReply, alias: str, request_id: str) -> dict[str, Any]:
    return translate.client_message(reply, message_from_chat, alias, request_id)


def client_body(reply: UpstreamReply, alias: str, request_id: str) -> bytes:
    return translate.client_body(reply, message_from_chat, alias, request_id)


def message_from_chat(data: dict[str, Any], alias: str, request_id: str) -> dict[str, Any]:
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    usage = data.get("usage") or {}
    return {
        "id": f"msg_{data.get('id') or request_id}",
        "type": "message",
        "role": "assistant",
        "model": alias,
        "content": content,
        "stop_reason": STOP_REASONS.get(choice.get("finish_reason"), "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
        },
    }


def degraded_message(alias: str, request_id: str, text: str) -> dict[str, Any]:
    return {
        "id": f"msg_agentproxy_{request_id}",
        "type": "message",
        "role": "assistant",
        "model": alias,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
