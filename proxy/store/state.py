"""Shared state: the small, hot, per-session facts the guards keep between requests.

Loop levels, session circuits, budget counters and open deployment circuits. One process keeps
them in memory (MemoryState); replicas behind a load balancer share them in Redis
(proxy/store/redis.py). Values are bytes, counters are floats; a key may expire. Every method
may raise StoreError: callers decide what a guard does without its state (budgets per policy,
the rest go on as if the session were new).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from cachetools import LRUCache


class StateStore(Protocol):
    backend: str

    async def get(self, space: str, key: str) -> bytes | None: ...

    async def set(self, space: str, key: str, value: bytes, ttl_s: float | None = None) -> None: ...

    async def delete(self, space: str, key: str) -> None: ...

    async def counters(self, space: str, key: str) -> dict[str, float]:
        """The counters of one key ({} when none)."""
        ...

    async def add(
        self,
        space: str,
        key: str,
        amounts: Mapping[str, float],
        *,
        first: Mapping[str, float] | None = None,
        ttl_s: float | None = None,
    ) -> dict[str, float]:
        """Add `amounts` atomically (every replica's additions count once); `first` fields are
        set only when absent. Returns the counters after the addition."""
        ...

    async def publish(self, space: str, field: str, value: float, ttl_s: float) -> None:
        """A fact every replica should learn (an open circuit), valid for `ttl_s`."""
        ...

    async def published(self, space: str) -> dict[str, float]:
        """The facts of a space still valid now."""
        ...

    async def close(self) -> None: ...


class MemoryState:
    """One process's state, bounded by entry count (oldest untouched go first)."""

    backend = "memory"

    def __init__(self, entries: int = 200_000) -> None:
        self._values: LRUCache[tuple[str, str], tuple[float, bytes]] = LRUCache(entries)
        self._counters: LRUCache[tuple[str, str], tuple[float, dict[str, float]]] = LRUCache(
            entries
        )
        self._published: dict[str, dict[str, tuple[float, float]]] = {}

    async def get(self, space: str, key: str) -> bytes | None:
        found = self._values.get((space, key))
        if found is None or found[0] < time.time():
            return None
        return found[1]

    async def set(self, space: str, key: str, value: bytes, ttl_s: float | None = None) -> None:
        self._values[(space, key)] = (_expiry(ttl_s), value)

    async def delete(self, space: str, key: str) -> None:
        self._values.pop((space, key), None)

    async def counters(self, space: str, key: str) -> dict[str, float]:
        found = self._counters.get((space, key))
        if found is None or found[0] < time.time():
            return {}
        return dict(found[1])

    async def add(
        self,
        space: str,
        key: str,
        amounts: Mapping[str, float],
        *,
        first: Mapping[str, float] | None = None,
        ttl_s: float | None = None,
    ) -> dict[str, float]:
        now = time.time()
        found = self._counters.get((space, key))
        values = dict(found[1]) if found is not None and found[0] >= now else {}
        for name, amount in amounts.items():
            values[name] = values.get(name, 0.0) + amount
        for name, value in (first or {}).items():
            values.setdefault(name, value)
        self._counters[(space, key)] = (_expiry(ttl_s), values)
        return dict(values)

    async def publish(self, space: str, field: str, value: float, ttl_s: float) -> None:
        self._published.setdefault(space, {})[field] = (_expiry(ttl_s), value)

    async def published(self, space: str) -> dict[str, float]:
        now = time.time()
        facts = self._published.get(space, {})
        for field in [f for f, (expiry, _) in facts.items() if expiry < now]:
            del facts[field]
        return {field: value for field, (_, value) in facts.items()}

    async def close(self) -> None:
        pass


def _expiry(ttl_s: float | None) -> float:
    return time.time() + ttl_s if ttl_s is not None else float("inf")
