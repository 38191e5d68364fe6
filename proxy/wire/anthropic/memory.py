"""What an Anthropic turn leaves the session's next: its memory across turns.

A turn re-sends the last one's history plus new messages, so the next turn's view lends the
view messages this one built for every leading client message the two share (one `==` each),
and maps only the rest (proxy/wire/anthropic/view.py: AnthropicView.of). The record holds no
more than that lending reads; it lives in the session's TurnMemory (proxy/sessions/
turn_memory.py), under the owner's key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.messages import Message

Block = dict[str, Any]


@dataclass(slots=True, frozen=True)
class Origin:
    """The client's message (its index, -1 for the system prompt) a view message stands for,
    and which of its blocks (positions in its content): all when the view message is the whole
    message."""

    index: int
    blocks: tuple[int, ...] | None  # None: a string content, or the system prompt as sent


@dataclass(slots=True, frozen=True)
class AnthropicMemory:
    system: Any  # the turn's system prompt, as sent
    messages: list[Message]  # the turn's client messages, as sent
    built: list[Message]  # its view as built, before any stage saw it
    ends: list[int]  # built's length after each client message
    origins: dict[int, Origin]  # by id() of a view message in `built`
    turn: object  # the turn's token (exchange.NativePrefix.turn)
    cut: int | None  # the client message holding the history's last compaction block
    restored: dict[int, tuple[Block, ...]]  # thinking put back, by client message
    loop: tuple[int, int | None] | None  # (len(messages), where its tool loop starts), if seen
