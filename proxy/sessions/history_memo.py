"""Each session's last history, as the rewrite chain received it, and what the next turn can
take from it without looking at the shared part again.

The chain compares a turn with its session's last history once (its stable prefix). The
lineage of a fingerprinted request needs the same fact, as digests of the history and of a
branch tip's prefix: it reads the memo first, so one `==` over the shared part stands for both
(the chain then takes the lineage's word: `Checked`), and the history's digest is the tip's
running hash extended by the new messages only, instead of a serialization of all of it.

Entries are keyed by the scoped session (owner/name): a tenant never reads another's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash
from cachetools import LRUCache

Message = dict[str, Any]


class Digest:
    """xxh3 over orjson's bytes of a list of messages, kept open to extend: `value` equals
    `xxh3_64_intdigest(orjson.dumps(messages))` for the messages it covers."""

    __slots__ = ("_open", "count", "value")

    def __init__(self, state: xxhash.xxh3_64, count: int) -> None:
        self._open = state  # over `[` and the messages, comma-separated: never updated again
        self.count = count
        closed = state.copy()
        closed.update(b"]")
        self.value: int = closed.intdigest()

    @classmethod
    def of(cls, messages: list[Message]) -> Digest:
        state = xxhash.xxh3_64()
        state.update(memoryview(orjson.dumps(messages))[:-1])
        return cls(state, len(messages))

    def extended(self, more: list[Message]) -> Digest:
        """The digest of the covered messages followed by `more`, hashing `more` only."""
        if not more:
            return self
        state = self._open.copy()
        if self.count:
            state.update(b",")
        state.update(memoryview(orjson.dumps(more))[1:-1])
        return Digest(state, self.count + len(more))


@dataclass(slots=True)
class Seen:
    size: int  # the request bytes it stands for: what the memo is bounded by
    messages: list[Message]  # a copy: the request's own list may be rewritten in place
    digest: Digest | None = None  # set when the lineage computed one that turn
    # The turn's identity (ex.rewrite.turn): what the stages' memos name, never this entry itself,
    # which would keep every old history alive in them.
    turn: object = field(default_factory=object)


@dataclass(frozen=True, slots=True)
class Checked:
    """What the lineage learnt of a request's history: its digest and, when it continued a
    branch from the memo, that `history[:len(seen)] == seen` (one `==`) for the memo's list
    `seen` of that branch."""

    history: list[Message]  # the exchange's messages list it is about (identity)
    digest: Digest  # of all of `history`
    seen: list[Message] | None = None  # the memo's list it compared with (identity)


class HistoryMemo:
    def __init__(self, memo_bytes: int) -> None:
        self.cache: LRUCache[str, Seen] = LRUCache(
            memo_bytes, getsizeof=lambda seen: max(1, seen.size)
        )

    def get(self, session: str) -> Seen | None:
        return self.cache.get(session)

    def remember(self, session: str, seen: Seen) -> None:
        if seen.size <= self.cache.maxsize:
            self.cache[session] = seen
