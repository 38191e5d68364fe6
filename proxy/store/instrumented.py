"""Make every store and state operation visible: duration, failures, bytes written.

Wraps whichever backend is configured, so the metrics mean the same for each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from proxy import tracing
from proxy.metrics import Metrics
from proxy.store.base import BlobInfo, Store
from proxy.store.listing import Listed
from proxy.store.shares import OwnerFull
from proxy.store.state import StateStore

log = logging.getLogger("agentproxy.store")
OWNER_FULL_LOG_EVERY_S = 60.0  # a full owner's refusals are logged at most this often

# Operations that write: each is a span of the request it serves (when tracing is on).
_WRITES = frozenset(
    {
        "put",
        "put_checkpoint",
        "put_listed",
        "put_unrecorded",
        "state_set",
        "state_delete",
        "add",
        "publish",
    }
)


class _Timed:
    def __init__(self, metrics: Metrics, backend: str) -> None:
        self.metrics = metrics
        self.backend = backend

    @asynccontextmanager
    async def _op(self, operation: str) -> AsyncIterator[None]:
        m = self.metrics
        started = time.perf_counter()
        try:
            if operation in _WRITES and tracing.active():
                attributes = {
                    "agentproxy.store.backend": self.backend,
                    "agentproxy.store.operation": operation,
                }
                with tracing.span("agentproxy.store.write", attributes):
                    yield
            else:
                yield
        except Exception:
            m.child(m.store_errors, self.backend, operation).inc()
            raise
        finally:
            m.child(m.store_duration, self.backend, operation).observe(
                time.perf_counter() - started
            )

    def _written(self, kind: str, size: int) -> None:
        m = self.metrics
        m.child(m.store_writes, kind).inc()
        m.child(m.store_written_bytes, kind).inc(size)


class InstrumentedStore(_Timed):
    def __init__(self, inner: Store, metrics: Metrics, backend: str) -> None:
        super().__init__(metrics, backend)
        self.inner = inner
        # Other processes write the same store: values that can change must be read again.
        self.shared: bool = getattr(inner, "shared", False)
        for operation in ("put", "get", "put_checkpoint", "get_checkpoint"):
            metrics.child(metrics.store_errors, backend, operation)
        if hasattr(inner, "on_owner_evicted"):
            inner.on_owner_evicted = self._owner_evicted
        self._owner_full_logged: dict[str, float] = {}  # owner -> when; owners are configured

    async def put(self, info: BlobInfo, data: bytes) -> None:
        try:
            async with self._op("put"):
                await self.inner.put(info, data)
        except OwnerFull as exc:
            self._owner_full(info.owner or "", exc)
            raise
        self._written(info.kind, len(data))

    async def put_many(
        self, items: list[tuple[BlobInfo, bytes]], listed: Mapping[str, Listed] | None = None
    ) -> None:
        """Several blobs at once (one transaction, one round trip), with the figures of the
        turns among them for the index of recorded sessions."""
        try:
            async with self._op("put"):
                await self.inner.put_many(items, listed)
        except OwnerFull as exc:
            self._owner_full(items[0][0].owner or "" if items else "", exc)
            raise
        for info, data in items:
            self._written(info.kind, len(data))

    def _owner_evicted(self, owner: str, sessions: list[str]) -> None:
        m = self.metrics
        m.child(m.store_sessions_removed, "owner_share").inc(len(sessions))
        log.info(
            "store: %d idle session(s) of %s evicted to keep it within store.max_owner_share",
            len(sessions), owner,
        )  # fmt: skip

    def _owner_full(self, owner: str, exc: OwnerFull) -> None:
        self.metrics.store_owner_full.inc()
        now = time.monotonic()
        last = self._owner_full_logged.get(owner)
        if last is None or now - last >= OWNER_FULL_LOG_EVERY_S:
            self._owner_full_logged[owner] = now
            log.warning("%s (other owners' writes go on; logged once a minute)", exc)

    async def put_listed(self, entries: list[Listed]) -> None:
        async with self._op("put_listed"):
            await self.inner.put_listed(entries)

    async def put_unrecorded(self, entries: list[Listed]) -> None:
        async with self._op("put_unrecorded"):
            await self.inner.put_unrecorded(entries)

    async def listed(self, owner: str | None, limit: int) -> list[Listed]:
        async with self._op("listed"):
            return await self.inner.listed(owner, limit)

    async def listed_one(self, session: str) -> Listed | None:
        async with self._op("listed"):
            return await self.inner.listed_one(session)

    async def get(self, ref: str) -> tuple[BlobInfo, bytes] | None:
        async with self._op("get"):
            return await self.inner.get(ref)

    async def blobs(self, session: str) -> list[BlobInfo]:
        async with self._op("list"):
            return await self.inner.blobs(session)

    async def search(self, session: str, phrase: str, limit: int = 5) -> list[tuple[BlobInfo, str]]:
        async with self._op("search"):
            return await self.inner.search(session, phrase, limit)

    async def get_checkpoint(self, session: str, key: str) -> bytes | None:
        async with self._op("get_checkpoint"):
            return await self.inner.get_checkpoint(session, key)

    async def put_checkpoint(self, session: str, key: str, data: bytes) -> None:
        async with self._op("put_checkpoint"):
            await self.inner.put_checkpoint(session, key, data)
        self._written("checkpoint", len(data))

    async def probe(self) -> None:
        async with self._op("probe"):
            await self.inner.probe()

    async def close(self) -> None:
        await self.inner.close()


class InstrumentedState(_Timed):
    def __init__(self, inner: StateStore, metrics: Metrics) -> None:
        super().__init__(metrics, inner.backend)
        self.inner = inner
        self.backend = inner.backend
        for operation in ("state_get", "state_set", "counters", "add"):
            metrics.child(metrics.store_errors, inner.backend, operation)

    async def get(self, space: str, key: str) -> bytes | None:
        async with self._op("state_get"):
            return await self.inner.get(space, key)

    async def set(self, space: str, key: str, value: bytes, ttl_s: float | None = None) -> None:
        async with self._op("state_set"):
            await self.inner.set(space, key, value, ttl_s)

    async def delete(self, space: str, key: str) -> None:
        async with self._op("state_delete"):
            await self.inner.delete(space, key)

    async def counters(self, space: str, key: str) -> dict[str, float]:
        async with self._op("counters"):
            return await self.inner.counters(space, key)

    async def add(
        self,
        space: str,
        key: str,
        amounts: Mapping[str, float],
        *,
        first: Mapping[str, float] | None = None,
        ttl_s: float | None = None,
    ) -> dict[str, float]:
        async with self._op("add"):
            return await self.inner.add(space, key, amounts, first=first, ttl_s=ttl_s)

    async def publish(self, space: str, field: str, value: float, ttl_s: float) -> None:
        async with self._op("publish"):
            await self.inner.publish(space, field, value, ttl_s)

    async def published(self, space: str) -> dict[str, float]:
        async with self._op("published"):
            return await self.inner.published(space)

    async def close(self) -> None:
        await self.inner.close()
