"""Gemini bodies as a conversation (proxy/recording/conversation.py: the shape): a content of
`functionResponse` parts is the tools' answer; snake_case fields read as camelCase ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.recording import conversation as shape
from proxy.recording.conversation import Message


class GeminiConversation:
    def messages(self, items: list[Any]) -> list[Message]:
        return [_content(item) for item in items if isinstance(item, dict)]

    def outside(self, body: Mapping[str, Any]) -> list[Message]:
        system = _field(body, "systemInstruction", "system_instruction")
        if not isinstance(system, dict):
            return []
        parts = _content(system)["parts"]
        return [shape.message("system", parts)] if parts else []

    def answer(self, reply: Mapping[str, Any]) -> Message | None:
        candidates = reply.get("candidates")
        if not isinstance(candidates, list) or not candidates:
            return None
        first = candidates[0] if isinstance(candidates[0], dict) else {}
        content = first.get("content")
        parts = _content(content)["parts"] if isinstance(content, dict) else []
        answer = shape.message("assistant", parts)
        answer["stop"] = _field(first, "finishReason", "finish_reason")
        return answer

    def error(self, reply: Mapping[str, Any]) -> str | None:
        return shape.error_message(reply)


def _field(value: Mapping[str, Any], camel: str, snake: str) -> Any:
    return value.get(camel, value.get(snake))


def _content(content: dict[str, Any]) -> Message:
    parts: list[dict[str, Any]] = []
    for part in content.get("parts") or ():
        if not isinstance(part, dict):
            continue
        call = _field(part, "functionCall", "function_call")
        answered = _field(part, "functionResponse", "function_response")
        if isinstance(call, dict):
            parts.append(shape.tool_call(call.get("id"), call.get("name"), call.get("args")))
        elif isinstance(answered, dict):
            ident = answered.get("id") or answered.get("name")
            parts.append(shape.tool_result(ident, answered.get("response")))
        elif part.get("thought") and isinstance(part.get("text"), str):
            parts.append(shape.reasoning(part["text"] or None))
        elif isinstance(part.get("text"), str):
            parts.append(shape.text(part["text"]))
        else:
            known = [k for k in part if k not in ("thoughtSignature", "thought_signature")]
            parts.append(shape.other(known[0] if known else "part"))
    role = content.get("role")
    if parts and all(p["type"] == "tool_result" for p in parts):
        role = "tool"
    return shape.message("assistant" if role == "model" else role or "user", parts)
