"""Chat Completions bodies as a conversation (proxy/recording/conversation.py: the shape)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.messages import call_input, call_name
from proxy.recording import conversation as shape
from proxy.recording.conversation import Message


class ChatConversation:
    def messages(self, items: list[Any]) -> list[Message]:
        return [_message(item) for item in items if isinstance(item, dict)]

    def outside(self, body: Mapping[str, Any]) -> list[Message]:
        return []  # its system prompt is a message

    def answer(self, reply: Mapping[str, Any]) -> Message | None:
        choices = reply.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        choice = choices[0]
        found = choice.get("message")
        answer = _message({"role": "assistant", **(found if isinstance(found, dict) else {})})
        answer["stop"] = choice.get("finish_reason")
        return answer

    def error(self, reply: Mapping[str, Any]) -> str | None:
        return shape.error_message(reply)


def _message(item: dict[str, Any]) -> Message:
    role = item.get("role")
    parts: list[dict[str, Any]] = []
    if role in ("tool", "function"):
        ident = item.get("tool_call_id") or item.get("name")
        parts.append(shape.tool_result(ident, shape.joined_text(item.get("content"))))
        return shape.message("tool", parts)
    for piece in ("reasoning_content", "reasoning"):
        if isinstance(item.get(piece), str) and item[piece]:
            parts.append(shape.reasoning(item[piece]))
    parts.extend(_content(item.get("content")))
    if isinstance(item.get("refusal"), str):
        parts.append(shape.text(item["refusal"]))
    for call in item.get("tool_calls") or ():
        if isinstance(call, dict):  # a function's JSON arguments or a custom call's text
            parts.append(shape.tool_call(call.get("id"), call_name(call), call_input(call)))
    if isinstance(item.get("function_call"), dict):
        call = item["function_call"]
        parts.append(shape.tool_call(None, call.get("name"), call.get("arguments")))
    return shape.message("system" if role == "developer" else role, parts)


def _content(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [shape.text(content)] if content else []
    if not isinstance(content, list):
        return []
    parts = []
    for block in content:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            parts.append(shape.text(block["text"]))
        elif isinstance(block, dict):
            parts.append(shape.other(block.get("type", "part")))
    return parts
