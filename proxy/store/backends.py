"""Open the configured backends: where blobs and checkpoints live, and where guard state lives.

`local` (the default): blobs in the embedded SQLite store, guard state in process memory — one
process. `redis`: both in Redis, shared by every replica that uses the same prefix.
"""

from __future__ import annotations

from typing import NamedTuple

from proxy.metrics import Metrics
from proxy.policies.spec import Keys, StoreSettings
from proxy.store.base import Store
from proxy.store.instrumented import InstrumentedState, InstrumentedStore
from proxy.store.local import LocalStore
from proxy.store.retention import Retention
from proxy.store.shares import owner_share
from proxy.store.state import MemoryState, StateStore
from proxy.store.windows import MemoryWindows, Windows


class Backends(NamedTuple):
    store: Store  # instrumented: what requests use
    state: StateStore
    retention: Retention  # the same store's upkeep, for the collector and `agentproxy store`


def open_backends(settings: StoreSettings, metrics: Metrics, keys: Keys | None = None) -> Backends:
    """`keys`: the configured keys, whose owners share the cap (proxy/store/shares.py)."""
    max_bytes = settings.max_mb * 1024 * 1024 if settings.max_mb is not None else None
    share = owner_share(settings, keys or Keys())
    metrics.store_owner_share.set(share or 1.0)
    if settings.backend == "redis":
        from proxy.store.redis import RedisConnection, RedisState, RedisStore

        redis = RedisConnection(settings)
        store = RedisStore(redis, max_bytes=max_bytes, owner_share=share, live_s=settings.live_s)
        return Backends(
            InstrumentedStore(store, metrics, "redis"),
            InstrumentedState(RedisState(redis), metrics),
            store,
        )
    local = LocalStore(
        settings.path, max_bytes=max_bytes, owner_share=share, live_s=settings.live_s
    )
    # In-process state needs no timing: it cannot be slow or fail.
    state = MemoryState(default_ttl_s=settings.session_ttl_s)  # as Redis keys expire
    return Backends(InstrumentedStore(local, metrics, "local"), state, local)


def open_windows(state: StateStore, lease_s: float) -> Windows:
    """The rate limits' windows beside the guard state: in Redis, shared by every replica,
    when the state is there (its connection shared too); else in this process. `lease_s`: how
    long a slot in Redis outlives a replica that died holding it."""
    inner = getattr(state, "inner", state)
    if inner.backend == "redis":
        from proxy.store.redis import RedisState
        from proxy.store.redis_windows import RedisWindows

        assert isinstance(inner, RedisState)
        return RedisWindows(inner.redis, lease_s)
    return MemoryWindows()
