"""OpenAI Responses: reading a reply, taking the proxy's own calls out of it. Errors are
OpenAI-shaped, as on the chat route."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.responses_view import CALLS, ResponsesView
from proxy.messages import Message
from proxy.pipeline import recall
from proxy.upstream.base import UpstreamReply


def reply_message(output: list[dict[str, Any]]) -> Message:
    """A response's output items as a chat-shaped assistant message."""
    texts = [
        part.get("text", "")
        for item in output
        if item.get("type") == "message"
        for part in item.get("content") or []
        if isinstance(part, dict) and part.get("type") == "output_text"
    ]
    calls = [
        {
            "id": item.get("call_id"),
            "type": "function",
            "function": {
                "name": item.get("name"),
                "arguments": item.get("arguments")
                if item.get("type") == "function_call"
                else item.get("input"),
            },
        }
        for item in output
        if item.get("type") in CALLS
    ]
    message: Message = {"role": "assistant", "content": "\n".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _arguments(item: dict[str, Any]) -> Any:
    return item.get("arguments") if item.get("type") == "function_call" else item.get("input")


def without_recall_items(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        item
        for item in output
        if not (item.get("type") in CALLS and item.get("name") == recall.TOOL_NAME)
    ]


class Replies:
    """Reads replies for one Responses exchange (Flow's `Replies`)."""

    def __init__(self, view: ResponsesView) -> None:
        self.view = view

    def reply_message(self, reply: UpstreamReply) -> Message:
        output = [i for i in reply.data.get("output") or [] if isinstance(i, dict)]
        self.view.remember_turn(output)
        return reply_message(output)

    def without_recall(self, reply: UpstreamReply, theirs: list[dict[str, Any]]) -> UpstreamReply:
        data = reply.data
        data["output"] = without_recall_items(data.get("output") or [])
        return UpstreamReply(data, orjson.dumps(data), reply.headers)
