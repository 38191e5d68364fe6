"""What the Anthropic and Responses views share: their tools seen as chat tools, how much
history two turns share, and a reply read back in the client's format, as sent or translated
from a chat completion."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from proxy.upstream.base import UpstreamReply

FromChat = Callable[[dict[str, Any], str, str], dict[str, Any]]  # (completion, alias, id)


def chat_tools(
    tools: Any,
    as_chat: Callable[[dict[str, Any]], dict[str, Any]],
    natives: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    """The client's tools as the stages read them; each remembered, by id() of its chat twin,
    so it goes back as the client sent it (the chat twins alone are counted as schema tokens)."""
    out = []
    for tool in tools or []:
        if isinstance(tool, dict):
            out.append(twin := as_chat(tool))
            natives[id(twin)] = tool
    return out


def client_message(
    reply: UpstreamReply, from_chat: FromChat, alias: str, request_id: str
) -> dict[str, Any]:
    """The reply as the client reads it: as sent, or translated from a chat completion."""
    if "choices" not in reply.data:
        return reply.data
    return from_chat(reply.data, alias, request_id)


def client_body(reply: UpstreamReply, from_chat: FromChat, alias: str, request_id: str) -> bytes:
    if "choices" not in reply.data:
        return reply.body  # the provider's bytes, untouched
    return orjson.dumps(from_chat(reply.data, alias, request_id))


def shared_prefix(new: list[Any], old: list[Any]) -> int:
    """How many leading entries two turns' histories share (Python's `==`: 1 equals 1.0,
    so a view lent for them names its client entries by position, never by object)."""
    n = min(len(new), len(old))
    if new[:n] == old[:n]:
        return n  # the usual turn: one compare in C
    shared = 0
    for a, b in zip(new, old, strict=False):
        if a is not b and a != b:
            break
        shared += 1
    return shared


def text_of_content(content: Any) -> str:
    """A message content's text: the string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""
