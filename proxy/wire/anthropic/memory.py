"""What an Anthropic turn leaves the session's next: its memory across turns, two records the
session's TurnMemory (proxy/sessions/turn_memory.py) keeps under the owner's key.

AnthropicMemory, the turn's: a turn re-sends the last one's history plus new messages, so the
next turn's view lends the view messages this one built for every leading client message the
two share (one `==` each), and maps only the rest (proxy/wire/anthropic/view.py:
AnthropicView.of). The record holds no more than that lending reads.

RelayedThinking, its answers': the signed thinking of the last answers relayed to the session
that called tools, which a later turn puts back where the client dropped it
(proxy/wire/anthropic/thinking.py)."""

from __future__ import annotations

from collections.abc import Mapping
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


_ENTRY_BYTES = 200  # what a relayed answer costs besides its strings (ids, dicts, the tuple)


@dataclass(frozen=True, slots=True)
class Relayed:
    """One relayed answer's tool_use ids and its thinking blocks, in order, as sent."""

    calls: frozenset[str]
    blocks: tuple[Block, ...]

    @property
    def size(self) -> int:
        strings = sum(len(str(v)) for b in self.blocks for v in b.values())
        return strings + sum(len(c) for c in self.calls) + _ENTRY_BYTES


@dataclass(frozen=True, slots=True)
class RelayedThinking:
    """The thinking of the last answers relayed to the session that called tools, by their
    first tool_use id, oldest first."""

    answers: Mapping[str, Relayed]

    @property
    def size(self) -> int:
        return sum(answer.size for answer in self.answers.values())
