"""What a Gemini turn leaves the session's next: its memory across turns.

The next turn's view lends the view messages this one built (and the calls they name) for
every leading content the two share, and maps only the rest (proxy/wire/gemini/view.py:
GeminiView.of). The record holds no more than that lending reads; it lives in the session's
TurnMemory (proxy/sessions/turn_memory.py), under the owner's key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.messages import Message


@dataclass(slots=True, frozen=True)
class Origin:
    """The client's content (its index, -1 for the system instruction) a view message stands
    for, and which of its parts (all: the whole content)."""

    index: int
    parts: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class GeminiMemory:
    system: Any  # the turn's system instruction, as sent
    contents: list[dict[str, Any]]  # the turn's contents, as sent
    built: list[Message]  # its view as built, before any stage saw it
    ends: list[int]  # built's length after each content
    origins: dict[int, Origin]  # by id() of a view message in `built`
    calls: dict[str, tuple[str, str | None]]  # a view call id -> (its name, the client's id)
    turn: object  # the turn's token (exchange.NativePrefix.turn)
