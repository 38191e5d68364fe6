"""Open the configured backends: where blobs and checkpoints live, and where guard state lives.

`local` (the default): blobs in the embedded SQLite store, guard state in process memory — one
process. `redis`: both in Redis, shared by every replica that uses the same prefix.
"""

from __future__ import annotations

from proxy.metrics import Metrics
from proxy.policies.spec import StoreSettings
from proxy.store.base import Store
from proxy.store.instrumented import InstrumentedState, InstrumentedStore
from proxy.store.local import LocalStore
from proxy.store.state import MemoryState, StateStore


def open_backends(settings: StoreSettings, metrics: Metrics) -> tuple[Store, StateStore]:
    if settings.backend == "redis":
        from proxy.store.redis import RedisConnection, RedisState, RedisStore

        redis = RedisConnection(settings)
        return (
            InstrumentedStore(RedisStore(redis), metrics, "redis"),
            InstrumentedState(RedisState(redis), metrics),
        )
    # In-process state needs no timing: it cannot be slow or fail.
    return InstrumentedStore(LocalStore(settings.path), metrics, "local"), MemoryState()
