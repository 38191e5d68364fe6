"""Which session a request belongs to (never a metric label).

The explicit `x-agentproxy-session` header wins; then `metadata.session_id` or `user` from the
body; else a fingerprint of the key, the system prompt and the first user message, which stays
the same on every turn of one conversation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import xxhash

from proxy.messages import text_of

SESSION_HEADER = "x-agentproxy-session"
PARENT_HEADER = "x-agentproxy-parent-session"
MAX_SESSION_CHARS = 128


def _usable(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= MAX_SESSION_CHARS and value.isprintable():
        return value
    return None


def session_id(headers: Mapping[str, str], body: dict[str, Any], key_name: str | None) -> str:
    explicit = _usable(headers.get(SESSION_HEADER))
    if explicit:
        return explicit
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and (given := _usable(metadata.get("session_id"))):
        return given
    if given := _usable(body.get("user")):
        return given
    return fingerprint(body.get("messages") or [], key_name)


def parent_session_id(headers: Mapping[str, str]) -> str | None:
    """A subagent names its parent session so budgets roll its spend up there."""
    return _usable(headers.get(PARENT_HEADER))


def fingerprint(messages: list[dict[str, Any]], key_name: str | None) -> str:
    system = next((m for m in messages if m.get("role") in ("system", "developer")), None)
    first_user = next((m for m in messages if m.get("role") == "user"), None)
    digest = xxhash.xxh3_64()
    for part in (key_name or "", text_of(system or {}), text_of(first_user or {})):
        digest.update(part.encode())
        digest.update(b"\0")
    return f"fp-{digest.hexdigest()}"
