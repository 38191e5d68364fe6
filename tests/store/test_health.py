"""The store's write check: what start-up and /readyz ask, bounded however often they ask."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import proxy.store.local
from proxy.store.base import StoreError
from proxy.store.health import StoreHealth
from proxy.store.local import LocalStore
from proxy.store.memory import MemoryStore


class CountingStore(MemoryStore):
    def __init__(self, fail: Exception | None = None, delay_s: float = 0.0) -> None:
        super().__init__()
        self.probes = 0
        self.fail = fail
        self.delay_s = delay_s

    async def probe(self) -> None:
        self.probes += 1
        await asyncio.sleep(self.delay_s)
        if self.fail is not None:
            raise self.fail


async def test_a_local_store_probe_writes_and_says_why_it_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(str(tmp_path / "data"))
    await store.probe()
    monkeypatch.setattr(proxy.store.local, "MIN_FREE_BYTES", 2**62)  # no disk is that big
    with pytest.raises(StoreError, match="disk full"):
        await store.probe()
    await store.close()

    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    blocked = LocalStore(str(in_the_way / "data"))
    with pytest.raises(StoreError, match="Not a directory"):
        await blocked.probe()
    await blocked.close()


async def test_checks_are_shared_and_remembered_for_a_second() -> None:
    now = [0.0]
    store = CountingStore()
    health = StoreHealth(store, "local", clock=lambda: now[0])
    statuses = await asyncio.gather(*(health.status() for _ in range(20)))
    assert store.probes == 1 and all(s.problem is None for s in statuses)
    now[0] = 1.5
    await health.status()
    assert store.probes == 2


async def test_a_failing_or_hanging_store_is_described() -> None:
    failing = StoreHealth(CountingStore(StoreError("redis redis://***@h/0: probe failed")), "redis")
    status = await failing.status()
    assert status.describe() == {
        "backend": "redis",
        "writable": False,
        "error": "redis redis://***@h/0: probe failed",
    }
    hanging = StoreHealth(CountingStore(delay_s=5), "local", timeout_s=0.05)
    assert (await hanging.status()).problem == "a write did not finish within 0.05s"


async def test_start_up_waits_a_little_for_the_store_then_names_it() -> None:
    store = CountingStore(StoreError("not answering"))
    health = StoreHealth(store, "redis")
    with pytest.raises(StoreError, match=r"store.backend: redis\) is not writable: not answering"):
        await health.require_writable(wait_s=0.3)
    assert store.probes >= 2  # asked again while waiting
