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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

# Eviction for the cap goes down to this share of it, so a collection is not needed again
# after the next few writes; one starts early once writes may have reached KICK_AT of it.
LOW_WATER = 0.85
KICK_AT = 0.95


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


class Pressure:
    """How close writes since the last collection may have brought the store to its cap:
    `kick` (set by whoever runs collections) is called once they may have reached KICK_AT."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.kick: Callable[[], None] | None = None
        self._size = 0  # at the last collection
        self._written = 0  # since

    def wrote(self, size: int) -> None:
        self._written += size
        if (
            self.kick is not None
            and self.max_bytes is not None
            and self._size + self._written >= self.max_bytes * KICK_AT
        ):
            self.kick()

    def collected(self, size: int) -> None:
        self._size = size
        self._written = 0


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
