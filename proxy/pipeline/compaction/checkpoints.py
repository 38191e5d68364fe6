"""Checkpoints: compaction results keyed by the hash of the history prefix they replace.

Later turns that start with the same prefix reuse a checkpoint byte for byte: no summarizer
call, and a stable prefix for provider prompt caches. Per session, a small index (checkpoint
positions and keys, the truncation horizon, a window cap learnt from an overflow) is kept in the
store under INDEX_KEY, so a restart loses nothing; in memory it sits in a bounded LRU, loaded on
the first turn of a session that needs it. The Store protocol is untouched: the index is one
more checkpoint blob.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from cachetools import LRUCache

from proxy.logs.limit import warn_limited
from proxy.messages import Message, estimate_tokens
from proxy.pipeline.compaction.artifacts import EMPTY, ArtifactLedger
from proxy.store.base import Store

log = logging.getLogger("agentproxy.compaction")

INDEX_KEY = "compaction-index"  # never a 16-hex-digit checkpoint key
MAX_CHECKPOINTS = 16  # per session; older ones are forgotten by the index (not the store)
WINDOW_UNITS = "provider"  # what a learnt window is counted in (older indexes: estimates)


def key_of(prefix_hash: int) -> str:
    return f"{prefix_hash:016x}"


@dataclass(frozen=True, slots=True)
class Mark:
    """A position in the raw history, valid while messages[:length] are unchanged."""

    length: int
    key: str  # key_of(prefix_hashes(messages)[length - 1])

    def holds(self, hashes: Sequence[int]) -> bool:
        return 0 < self.length <= len(hashes) and key_of(hashes[self.length - 1]) == self.key


@dataclass(frozen=True, slots=True)
class Checkpoint:
    mark: Mark  # mark.length is the cut: messages[head:cut] are replaced
    kind: str  # "summary" or "middle_out"
    messages: tuple[Message, ...]  # what replaces them
    ref: str  # the archive of what was replaced
    # What the tool calls of messages[:cut] touched: the next compaction extends it.
    ledger: ArtifactLedger = EMPTY

    @property
    def size(self) -> int:
        """Roughly its bytes in memory, for the cache that holds it."""
        return 256 + sum(4 * estimate_tokens(m) for m in self.messages) + self.ledger.size

    def to_bytes(self) -> bytes:
        raw = {
            "kind": self.kind,
            "cut": self.mark.length,
            "ref": self.ref,
            "messages": self.messages,
        }
        if self.ledger:
            raw["ledger"] = self.ledger.to_json()
        return orjson.dumps(raw)

    @classmethod
    def from_bytes(cls, mark: Mark, data: bytes) -> Checkpoint:
        raw = orjson.loads(data)
        ledger = ArtifactLedger.from_json(raw.get("ledger"))  # none in an older checkpoint
        return cls(mark, str(raw["kind"]), tuple(raw["messages"]), str(raw["ref"]), ledger)

    def fresh_messages(self) -> list[Message]:
        # Copies, so a later stage that edits a message in place cannot corrupt the cache.
        return [dict(m) for m in self.messages]


@dataclass(slots=True)
class SessionState:
    checkpoints: list[Mark] = field(default_factory=list)  # oldest first
    truncation: Mark | None = None  # writing-tool arguments before this are truncated
    # Provider tokens (the prompt as the meter measures and calibrates it, plus the answer's
    # reservation) that the provider said overflow its context: the session's window counts
    # as no larger from then on. In the catalog's units, whatever a turn is measured in.
    window_cap: int | None = None
    # The deployment model (litellm spelling) that overflowed: a fallback to another model has
    # its own window. None (an index saved before this was kept): any model.
    window_model: str | None = None
    # The largest prompt (with its answer's reservation; provider tokens) that model took
    # since: the floor of
    # any window learnt later, so that a denser text overflowing does not shrink it for good.
    window_floor: int = 0
    # One compaction at a time per session: a concurrent turn waits and reuses the result.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def to_bytes(self) -> bytes:
        def mark(m: Mark | None) -> list[Any] | None:
            return None if m is None else [m.length, m.key]

        return orjson.dumps(
            {
                "checkpoints": [mark(m) for m in self.checkpoints],
                "truncation": mark(self.truncation),
                "window_cap": self.window_cap,
                "window_model": self.window_model,
                "window_floor": self.window_floor,
                "window_units": WINDOW_UNITS,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionState:
        raw = orjson.loads(data)
        truncation = raw.get("truncation")
        state = cls(
            checkpoints=[Mark(int(n), str(k)) for n, k in raw.get("checkpoints") or []],
            truncation=Mark(int(truncation[0]), str(truncation[1])) if truncation else None,
        )
        # An index saved before the window was kept in provider tokens holds estimates (half
        # the real figure on code): forgotten, the session learns it again at its next
        # overflow rather than over-compact every turn on a cap in the wrong units.
        if raw.get("window_units") == WINDOW_UNITS:
            state.window_cap = raw.get("window_cap")
            state.window_model = raw.get("window_model")
            state.window_floor = int(raw.get("window_floor") or 0)
        return state

    def cap_for(self, model: str) -> int | None:
        """The window learnt from an overflow, if it was learnt on `model`."""
        if self.window_model is None or self.window_model == model:
            return self.window_cap
        return None

    def floor_for(self, model: str) -> int:
        """The largest prompt `model` took since the window was learnt on it (0: none)."""
        return self.window_floor if self.window_model in (None, model) else 0

    def accepted(self, model: str, tokens: int) -> None:
        if self.window_model in (None, model) and tokens > self.window_floor:
            self.window_floor = tokens

    def needed_length(self) -> int:
        """How many leading messages must be hashed to check every mark."""
        lengths = [m.length for m in self.checkpoints]
        if self.truncation is not None:
            lengths.append(self.truncation.length)
        return max(lengths, default=0)

    def longest_checkpoint(self, hashes: Sequence[int]) -> Mark | None:
        held = [m for m in self.checkpoints if m.holds(hashes)]
        return max(held, key=lambda m: m.length, default=None)


class CheckpointIndex:
    def __init__(self, sessions: int = 4096, bodies_bytes: int = 16 * 1024 * 1024) -> None:
        self._states: LRUCache[str, SessionState] = LRUCache(sessions)
        self._bodies: LRUCache[tuple[str, str], Checkpoint] = LRUCache(
            bodies_bytes, getsizeof=lambda checkpoint: checkpoint.size
        )

    @property
    def memo(self) -> LRUCache[tuple[str, str], Checkpoint]:
        return self._bodies

    @property
    def states(self) -> LRUCache[str, SessionState]:
        return self._states

    def peek(self, session: str) -> SessionState | None:
        return self._states.get(session)

    async def state(self, store: Store, session: str) -> SessionState:
        state = self._states.get(session) if not store.shared else None
        if state is not None:
            return state
        try:
            data = await store.get_checkpoint(session, INDEX_KEY)
            state = SessionState.from_bytes(data) if data else SessionState()
        except Exception as exc:  # unreadable index: compact from scratch, retry next turn
            warn_limited(log, "checkpoint.index", "compaction index of session %s unreadable: %s",
                         session, exc)  # fmt: skip
            return SessionState()
        if store.shared:  # another replica may add a checkpoint before our next turn
            return state
        return self._states.setdefault(session, state)

    async def save(self, store: Store, session: str, state: SessionState) -> None:
        await store.put_checkpoint(session, INDEX_KEY, state.to_bytes())

    async def add(
        self, store: Store, session: str, state: SessionState, checkpoint: Checkpoint
    ) -> None:
        """The checkpoint first, then the index that points at it."""
        await store.put_checkpoint(session, checkpoint.mark.key, checkpoint.to_bytes())
        self._bodies[(session, checkpoint.mark.key)] = checkpoint
        marks = [m for m in state.checkpoints if m != checkpoint.mark] + [checkpoint.mark]
        state.checkpoints = marks[-MAX_CHECKPOINTS:]
        await self.save(store, session, state)

    async def body(self, store: Store, session: str, mark: Mark) -> Checkpoint | None:
        cached = self._bodies.get((session, mark.key))
        if cached is not None:
            return cached
        try:
            data = await store.get_checkpoint(session, mark.key)
            checkpoint = Checkpoint.from_bytes(mark, data) if data else None
        except Exception as exc:
            warn_limited(log, "checkpoint.body", "checkpoint %s of session %s unreadable: %s",
                         mark.key, session, exc)  # fmt: skip
            return None
        if checkpoint is not None:
            self._bodies[(session, mark.key)] = checkpoint
        return checkpoint
