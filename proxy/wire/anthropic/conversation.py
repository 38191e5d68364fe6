"""Anthropic Messages bodies as a conversation (proxy/recording/conversation.py: the shape):
a user message of `tool_result` blocks is the tools' answer, not a person's words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.recording import conversation as shape
from proxy.recording.conversation import Message


class AnthropicConversation:
    def messages(self, items: list[Any]) -> list[Message]:
        return [_message(item) for item in items if isinstance(item, dict)]

    def outside(self, body: Mapping[str, Any]) -> list[Message]:
        system = body.get("system")
        parts = _blocks(system)
        return [shape.message("system", parts)] if parts else []

    def answer(self, reply: Mapping[str, Any]) -> Message | None:
        if reply.get("type") == "error" or not isinstance(reply.get("content"), list):
            return None
        answer = shape.message("assistant", _blocks(reply["content"]))
        answer["stop"] = reply.get("stop_reason")
        return answer

    def error(self, reply: Mapping[str, Any]) -> str | None:
        return shape.error_message(reply)


def _message(item: dict[str, Any]) -> Message:
    parts = _blocks(item.get("content"))
    role = item.get("role")
    if role == "user" and parts and all(p["type"] == "tool_result" for p in parts):
        role = "tool"
    return shape.message(role, parts)


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [shape.text(content)] if content else []
    if not isinstance(content, list):
        return []
    parts = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(shape.text(block.get("text", "")))
        elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
            parts.append(shape.tool_call(block.get("id"), block.get("name"), block.get("input")))
        elif kind == "tool_result" or (isinstance(kind, str) and kind.endswith("_tool_result")):
            content_ = block.get("content")
            result = _result_text(content_)
            parts.append(shape.tool_result(block.get("tool_use_id"), result,
                                           block.get("is_error")))  # fmt: skip
        elif kind == "thinking":
            parts.append(shape.reasoning(block.get("thinking") or None))
        elif kind == "redacted_thinking":
            parts.append(shape.reasoning())
        else:
            parts.append(shape.other(kind or "block"))
    return parts


def _result_text(content: Any) -> Any:
    """A tool result's content: its text blocks joined when it is only text."""
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
            return "\n".join(texts)  # type: ignore[arg-type]
    return content
