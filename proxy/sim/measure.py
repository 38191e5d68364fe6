"""What a body weighs in context tokens: the one measure `agentproxy replay` reports and the
session list (GET /admin/sessions) shows, so the two agree on a recorded session.

A body in any wire is read as the simulator reads it (as chat: contents, tool calls, tool
schemas; four characters a token, four more a message), entry by entry: its list (messages,
input items, contents) each on its own, and the rest (system, instructions, tools) once. So a
body's tokens are the sum of its parts', and whoever keeps the parts' counts (the recording's
writer, by the hash of each entry) measures a turn by its new entries only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.sim.anthropic import to_chat as anthropic_to_chat
from proxy.sim.gemini import to_chat as gemini_to_chat
from proxy.sim.model import estimate_prompt_tokens
from proxy.sim.responses import to_chat as responses_to_chat

JSON = dict[str, Any]
# Each wire's body read as chat, and where it keeps its list of entries.
_READERS: dict[str, tuple[Callable[[JSON], JSON], str]] = {
    "chat": (lambda body: body, "messages"),
    "anthropic": (anthropic_to_chat, "messages"),
    "responses": (responses_to_chat, "input"),
    "gemini": (gemini_to_chat, "contents"),
}
_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "anthropic",
    "/v1/responses": "responses",
}
_GEMINI_ACTIONS = (":generateContent", ":streamGenerateContent")


def wire_at(path: str) -> str:
    """The wire of a model route's path (a Gemini one names its model)."""
    if path in _PATHS:
        return _PATHS[path]
    if path.endswith(_GEMINI_ACTIONS):
        return "gemini"
    raise ValueError(f"no wire is served at {path}")


def list_key(wire: str) -> str:
    return _READERS[wire][1]


def body_tokens(wire: str, body: JSON) -> int:
    """The body's context tokens: its rest's plus each entry's."""
    key = list_key(wire)
    entries = body.get(key)
    if not isinstance(entries, list):
        return rest_tokens(wire, body)
    rest = {k: v for k, v in body.items() if k != key}
    return rest_tokens(wire, rest) + sum(entry_tokens(wire, entry) for entry in entries)


def rest_tokens(wire: str, rest: JSON) -> int:
    """A body without its list (a string input counts here: it is not a list)."""
    read, key = _READERS[wire]
    if isinstance(rest.get(key), list) or key not in rest:
        rest = {**rest, key: []}
    return _counted(read, rest, skip_empty=True)


def entry_tokens(wire: str, entry: Any) -> int:
    """One entry of a body's list, read alone."""
    read, key = _READERS[wire]
    if not isinstance(entry, dict):
        return 0
    return _counted(read, {key: [entry]}, skip_empty=False)


def _counted(read: Callable[[JSON], JSON], body: JSON, skip_empty: bool) -> int:
    try:
        chat = read(body)
    except (KeyError, TypeError, ValueError, AttributeError):
        return 0  # a shape the simulator cannot read weighs nothing, as it would answer 400
    messages = chat.get("messages") or []
    if skip_empty:  # the filler a reader adds to an empty list (Responses' empty user turn)
        messages = [m for m in messages if not _empty_user(m)]
    return estimate_prompt_tokens({"messages": messages, "tools": chat.get("tools")})


def _empty_user(message: Any) -> bool:
    return (
        isinstance(message, dict) and message.get("role") == "user" and not message.get("content")
    )
