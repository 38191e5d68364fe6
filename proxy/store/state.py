"""Shared state: the small, hot, per-session facts the guards keep between requests.

Loop levels, session circuits, budget counters and open deployment circuits. One process keeps
them in memory (MemoryState); replicas behind a load balancer share them in Redis
(proxy/store/redis.py). Values are bytes, counters are floats; a key may expire. Every method
may raise StoreError: callers decide what a guard does without its state (budgets per policy,
the rest go on as if the session were new).
"""

from __future__ import annotations

import base64
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar


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


# What one entry costs beyond its value's bytes: its key and the bookkeeping. Measured with
# tracemalloc: ~450 bytes for a guard record under a 40-character key, ~700 for a budget's
# three counters under a 60-character one.
ENTRY_OVERHEAD = 384
FIELD_BYTES = 96  # one counter: its name and float in the counters' dict
V = TypeVar("V")


class Entries(Generic[V]):
    """A least-recently-used map bounded by bytes whose entries expire. An expired entry is
    dropped when read, and every write drops those whose time is up, read or not: entries are
    also kept by TTL in write order, which for one TTL is expiry order, and the callers use a
    handful of TTLs. Every operation is O(1) but for that handful: this sits on every
    request's path (cachetools' TLRUCache cost ~7x more per get and set)."""

    def __init__(self, max_bytes: int, size_of: Callable[[V], int]) -> None:
        self.maxsize = max_bytes
        self.currsize = 0
        self._size_of = size_of
        # key -> (expiry, value, size, ttl); least recently used first
        self._data: OrderedDict[tuple[str, str], tuple[float, V, int, float]] = OrderedDict()
        self._by_ttl: dict[float, OrderedDict[tuple[str, str], None]] = {}  # write order

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._data)

    def get(self, key: tuple[str, str]) -> V | None:
        found = self._data.get(key)
        if found is None:
            return None
        if found[0] < time.time():
            self.pop(key)
            return None
        self._data.move_to_end(key)
        return found[1]

    def put(self, key: tuple[str, str], value: V, ttl_s: float) -> None:
        """Store `value` for `ttl_s` seconds (inf: until evicted). One larger than the whole
        map is forgotten at once, as if evicted."""
        self.pop(key)
        now = time.time()
        size = self._size_of(value)
        if size <= self.maxsize:
            self._data[key] = (now + ttl_s, value, size, ttl_s)
            self._by_ttl.setdefault(ttl_s, OrderedDict())[key] = None
            self.currsize += size
        self._expire(now)
        while self.currsize > self.maxsize:
            self.pop(next(iter(self._data)))

    def pop(self, key: tuple[str, str]) -> None:
        found = self._data.pop(key, None)
        if found is not None:
            self.currsize -= found[2]
            del self._by_ttl[found[3]][key]

    def rows(self) -> Iterator[tuple[tuple[str, str], V, float, float]]:
        """(key, value, expiry, ttl) of every entry not yet expired, least recently used first."""
        now = time.time()
        for key, (expiry, value, _, ttl) in self._data.items():
            if expiry >= now:
                yield key, value, expiry, ttl

    def restore(self, rows: Iterator[tuple[tuple[str, str], V, float, float]]) -> None:
        """Put back what `rows` gave (least recently used first), each with its own expiry."""
        now = time.time()
        for key, value, expiry, ttl in rows:
            if expiry < now:
                continue
            self.put(key, value, ttl)
            found = self._data.get(key)
            if found is not None:  # not refused as larger than the whole map
                self._data[key] = (expiry, found[1], found[2], found[3])
        for written in self._by_ttl.values():  # write order is expiry order within a ttl
            ordered = sorted(written, key=lambda k: self._data[k][0])
            written.clear()
            written.update(dict.fromkeys(ordered))

    def _expire(self, now: float) -> None:
        for written in self._by_ttl.values():
            while written:
                oldest = next(iter(written))
                if self._data[oldest][0] >= now:
                    break
                self.pop(oldest)


class MemoryState:
    """One process's state, bounded by bytes (the least recently used go first when full) and
    by time: an entry is dropped when its ttl runs out, not merely hidden, so a process that
    sees sessions come and go for months holds only the live ones."""

    backend = "memory"

    def __init__(
        self, max_bytes: int = 32 * 1024 * 1024, default_ttl_s: float = 7 * 24 * 3600.0
    ) -> None:
        self.default_ttl_s = default_ttl_s  # for a ttl of None, as Redis' store.session_ttl
        self._values: Entries[bytes] = Entries(max_bytes // 2, _value_bytes)
        self._counters: Entries[dict[str, float]] = Entries(max_bytes // 2, _counters_bytes)
        self._published: dict[str, dict[str, tuple[float, float]]] = {}

    def memos(self) -> dict[str, Entries[Any]]:
        """Its two halves, shown beside the memos (agentproxy_memo_bytes)."""
        return {"state_values": self._values, "state_counters": self._counters}

    async def get(self, space: str, key: str) -> bytes | None:
        return self._values.get((space, key))

    async def set(self, space: str, key: str, value: bytes, ttl_s: float | None = None) -> None:
        self.set_now(space, key, value, ttl_s)

    async def delete(self, space: str, key: str) -> None:
        self.delete_now(space, key)

    async def counters(self, space: str, key: str) -> dict[str, float]:
        found = self._counters.get((space, key))
        return {} if found is None else dict(found)

    async def add(
        self,
        space: str,
        key: str,
        amounts: Mapping[str, float],
        *,
        first: Mapping[str, float] | None = None,
        ttl_s: float | None = None,
    ) -> dict[str, float]:
        return dict(self.add_now(space, key, amounts, first, ttl_s))

    async def publish(self, space: str, field: str, value: float, ttl_s: float) -> None:
        self.publish_now(space, field, value, ttl_s)

    async def published(self, space: str) -> dict[str, float]:
        now = time.time()
        facts = self._published.get(space, {})
        for field in [f for f, (expiry, _) in facts.items() if expiry < now]:
            del facts[field]
        return {field: value for field, (_, value) in facts.items()}

    # The writes, made at once: nothing here waits, so a caller outside a coroutine (one that
    # replays changes another process made) writes exactly as the methods above do.

    def set_now(self, space: str, key: str, value: bytes, ttl_s: float | None) -> None:
        self._values.put((space, key), value, self.default_ttl_s if ttl_s is None else ttl_s)

    def delete_now(self, space: str, key: str) -> None:
        self._values.pop((space, key))

    def add_now(
        self,
        space: str,
        key: str,
        amounts: Mapping[str, float],
        first: Mapping[str, float] | None,
        ttl_s: float | None,
    ) -> dict[str, float]:
        """The counters after the addition (the stored dict itself: copy it to hand it out)."""
        found = self._counters.get((space, key))
        values = dict(found) if found is not None else {}
        for name, amount in amounts.items():
            values[name] = values.get(name, 0.0) + amount
        for name, value in (first or {}).items():
            values.setdefault(name, value)
        self._counters.put((space, key), values, self.default_ttl_s if ttl_s is None else ttl_s)
        return values

    def publish_now(self, space: str, field: str, value: float, ttl_s: float | None) -> None:
        self._published.setdefault(space, {})[field] = (_expiry(ttl_s), value)

    async def close(self) -> None:
        pass

    def export(self) -> dict[str, Any]:
        """Every entry and published fact still valid, as JSON-ready data: what another
        process restores to go on exactly where this one stopped."""
        return {
            "values": [
                [*key, base64.b64encode(value).decode(), _finite(expiry), _finite(ttl)]
                for key, value, expiry, ttl in self._values.rows()
            ],
            "counters": [
                [*key, counters, _finite(expiry), _finite(ttl)]
                for key, counters, expiry, ttl in self._counters.rows()
            ],
            "published": {
                space: {field: [_finite(expiry), value] for field, (expiry, value) in facts.items()}
                for space, facts in self._published.items()
            },
        }

    def restore(self, saved: Mapping[str, Any]) -> int:
        """Take back what `export` gave; the number of entries restored."""
        self._values.restore(
            ((space, key), base64.b64decode(value), _infinite(expiry), _infinite(ttl))
            for space, key, value, expiry, ttl in saved.get("values", [])
        )
        self._counters.restore(
            ((space, key), dict(counters), _infinite(expiry), _infinite(ttl))
            for space, key, counters, expiry, ttl in saved.get("counters", [])
        )
        now = time.time()
        for space, facts in saved.get("published", {}).items():
            for field, (expiry, value) in facts.items():
                if _infinite(expiry) >= now:
                    self._published.setdefault(space, {})[field] = (_infinite(expiry), value)
        return len(self._values) + len(self._counters)


def _finite(seconds: float) -> float | None:
    return None if seconds == float("inf") else seconds  # JSON has no infinity


def _infinite(seconds: float | None) -> float:
    return float("inf") if seconds is None else float(seconds)


def _expiry(ttl_s: float | None) -> float:
    return time.time() + ttl_s if ttl_s is not None else float("inf")


def _value_bytes(value: bytes) -> int:
    return ENTRY_OVERHEAD + len(value)


def _counters_bytes(counters: dict[str, float]) -> int:
    return ENTRY_OVERHEAD + FIELD_BYTES * len(counters)
