"""Responses bodies as a conversation (proxy/recording/conversation.py: the shape): each input
item is a message, a call or an output, a reasoning item; a string input is the user's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.recording import conversation as shape
from proxy.recording.conversation import Message

CALLS = ("function_call", "custom_tool_call")
OUTPUTS = ("function_call_output", "custom_tool_call_output")


class ResponsesConversation:
    def messages(self, items: list[Any]) -> list[Message]:
        return [_item(item) for item in items if isinstance(item, dict)]

    def outside(self, body: Mapping[str, Any]) -> list[Message]:
        said = []
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            said.append(shape.message("system", [shape.text(body["instructions"])]))
        if isinstance(body.get("input"), str):
            said.append(shape.message("user", [shape.text(body["input"])]))
        return said

    def answer(self, reply: Mapping[str, Any]) -> Message | None:
        output = reply.get("output")
        if not isinstance(output, list):
            return None
        parts = [part for item in self.messages(output) for part in item["parts"]]
        answer = shape.message("assistant", parts)
        details = reply.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        answer["stop"] = reason or reply.get("status")
        return answer

    def error(self, reply: Mapping[str, Any]) -> str | None:
        return shape.error_message(reply)


def _item(item: dict[str, Any]) -> Message:
    kind = item.get("type", "message")
    if kind == "message" or (kind is None and "role" in item):
        role = item.get("role")
        return shape.message("system" if role == "developer" else role, _content(item))
    if kind in CALLS:
        arguments = item.get("arguments", item.get("input"))
        call = shape.tool_call(item.get("call_id"), item.get("name"), arguments)
        return shape.message("assistant", [call])
    if kind in OUTPUTS or (isinstance(kind, str) and kind.endswith("_call_output")):
        output = item.get("output")
        return shape.message(
            "tool", [shape.tool_result(item.get("call_id"), shape.joined_text(output))]
        )
    if kind == "reasoning":
        summary = [s.get("text") for s in item.get("summary") or () if isinstance(s, dict)]
        text = "\n".join(t for t in summary if isinstance(t, str))
        return shape.message("assistant", [shape.reasoning(text or None)])
    if isinstance(kind, str) and kind.endswith("_call"):  # a hosted or local tool's call
        ident = item.get("call_id") or item.get("id")
        return shape.message("assistant", [shape.tool_call(ident, kind, item)])
    return shape.message("assistant", [shape.other(kind)])


def _content(item: dict[str, Any]) -> list[dict[str, Any]]:
    content = item.get("content")
    if isinstance(content, str):
        return [shape.text(content)] if content else []
    parts = []
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            parts.append(shape.text(block["text"]))
        elif isinstance(block, dict) and isinstance(block.get("refusal"), str):
            parts.append(shape.text(block["refusal"]))
        elif isinstance(block, dict):
            parts.append(shape.other(block.get("type", "part")))
    return parts
