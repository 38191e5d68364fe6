"""Retention: what a store backend offers so that it stays bounded for months.

A session's data (blobs, archived history, checkpoints) lives as long as the session is
active: it goes `session_ttl` after the session's last request, and before that when the store
is over its size cap, whole sessions at a time, least recently active first. A session active
within `live_s` is live and never evicted: the references its requests name must resolve.

Activity reaches the store two ways (proxy/store/activity.py): a session's first request in a
process touches it before anything is read (so a collection running now either sees it or has
already removed all of it), and later requests are flushed in batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from proxy.store.base import StoreError

# Eviction for the cap goes down to this share of it, so a collection is not needed again
# after the next few writes; one starts early once writes may have reached KICK_AT of it.
LOW_WATER = 0.85
KICK_AT = 0.95
ROOM_WAIT_S = 5.0  # longest a write waits at the cap for a collection to make room


@dataclass(frozen=True, slots=True)
class Collected:
    """What one collection removed."""

    expired: tuple[str, ...] = ()  # sessions past session_ttl
    evicted: tuple[str, ...] = ()  # sessions removed for the size cap
    bytes_before: int = 0  # the store's size as the cap counts it
    bytes_after: int = 0
    # The cap is still exceeded and only live sessions are left to evict.
    over_cap: bool = False

    @property
    def removed(self) -> tuple[str, ...]:
        return self.expired + self.evicted


@dataclass(frozen=True, slots=True)
class StoreStats:
    backend: str
    sessions: int  # sessions with stored data
    live_sessions: int  # of which active within live_s
    blobs: int
    checkpoints: int
    payload_bytes: int  # blob and checkpoint bytes as written
    size_bytes: int  # what the cap counts: pages in use (local), payload (redis)
    max_bytes: int | None
    oldest_activity: float | None  # unix time of the least recently active session
    details: dict[str, object] = field(default_factory=dict)  # backend specifics

    def describe(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "sessions": self.sessions,
            "live_sessions": self.live_sessions,
            "blobs": self.blobs,
            "checkpoints": self.checkpoints,
            "payload_bytes": self.payload_bytes,
            "size_bytes": self.size_bytes,
            "max_bytes": self.max_bytes,
            "oldest_activity": self.oldest_activity,
            **self.details,
        }


class StoreFull(StoreError):
    """The store is at its cap and a collection could not make room: only live sessions are
    left. The write is refused; what was to be stored stays in the request's context."""


class Pressure:
    """How close the store may be to its cap, between collections.

    The room data may take is the cap less `reserve` (what the store needs besides: a
    write-ahead log): the `limit`. Writes are counted before they happen; past KICK_AT of the
    limit `kick` (set by whoever runs collections) is called, and a collection evicts from
    there down to LOW_WATER. At the limit itself a write waits for a collection (up to
    ROOM_WAIT_S) and is refused if there is still no room: the cap holds however slow
    collections are, what would have been stored stays in the context (the archive's failure
    rule), and no live session's data is evicted. Once a collection has found only live
    sessions (`full`), writes are refused at once, each kicking another collection, until one
    makes room: waiting would only slow every request that writes (a soak at the cap went
    from 150 to 10 requests a second, each write waiting its 5 s), for the same refusal.
    """

    def __init__(self, max_bytes: int | None, *, reserve: int = 0) -> None:
        self.limit = None if max_bytes is None else max(1, max_bytes - reserve)
        self.kick: Callable[[], None] | None = None
        self._size = 0  # at the last collection
        self._claimed = 0.0  # since, as it takes room in the store
        self._ratio = 1.0  # room taken per payload byte, as measured at the last collection
        self._collected = asyncio.Event()
        self.full = False  # the last collection could not get under the limit

    def _estimate(self, adding: int = 0) -> float:
        return self._size + self._claimed + adding * self._ratio

    def at_cap(self, size: int) -> bool:
        """Whether `size` more bytes may not fit: then `room_for` must be awaited first (unless
        the write adds nothing), and `claim` called right after it, with no await between.
        Free when far from the cap, the usual case."""
        limit = self.limit
        return limit is not None and self.kick is not None and self._estimate(size) >= limit

    async def room_for(self, size: int, where: str) -> None:
        """Return once `size` more bytes fit; raise StoreFull if they do not after
        ROOM_WAIT_S of collections."""
        limit = self.limit
        if limit is None or self.kick is None:
            return
        give_up = time.monotonic() + ROOM_WAIT_S
        while self._estimate(size) >= limit:
            left = give_up - time.monotonic()
            if self.full:
                self.kick()  # a session may have stopped being live since
                raise StoreFull(
                    f"{where}: at store.max_mb with only live sessions left: not written, "
                    "kept in the context"
                )
            if left <= 0:
                raise StoreFull(
                    f"{where}: at store.max_mb and no room made within {ROOM_WAIT_S:g}s "
                    "(collections failing or slow): not written, kept in the context"
                )
            self._collected.clear()
            self.kick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._collected.wait(), left)

    def claim(self, size: int) -> None:
        """Count `size` bytes about to be written (before the write: concurrent writers that
        waited for room must not all take the same room)."""
        self._claimed += size * self._ratio
        limit = self.limit
        if self.kick is not None and limit is not None and self._estimate() >= limit * KICK_AT:
            self.kick()

    def release(self, size: int) -> None:
        """A claimed write that did not happen (refused for its owner's share)."""
        self._claimed = max(0.0, self._claimed - size * self._ratio)

    def share_of(self, share: float) -> int:
        """`share` of the limit, counted in payload bytes as the owners' counts are (not
        scaled by the room a byte takes: learnt on a small store, that ratio is mostly
        fixed overhead and would shrink every share)."""
        assert self.limit is not None
        return max(1, int(share * self.limit))

    def collected(self, size: int, payload: int | None = None) -> None:
        """The store's size after a collection, and the payload it holds if it differs
        (pages, indexes: the room a written byte takes is learnt from them)."""
        self._size = size
        self._claimed = 0.0
        if payload:
            self._ratio = min(4.0, max(1.0, size / payload))
        self.full = self.limit is not None and size >= self.limit
        self._collected.set()


class Retention(Protocol):
    pressure: Pressure

    async def touch(self, sessions: Mapping[str, float]) -> None:
        """Record each session's latest activity (unix time); sessions without data are
        ignored. Durability is not needed: a lost touch only makes a session look older."""
        ...

    async def collect(self, *, expire_before: float, live_after: float) -> Collected:
        """Delete sessions last active before `expire_before`, then, while over the cap,
        whole sessions least recently active first, never one active after `live_after`.
        Gives the freed space back to the system."""
        ...

    async def stats(self, *, live_after: float) -> StoreStats: ...
