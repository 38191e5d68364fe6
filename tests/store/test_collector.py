"""The background collection: started early by writes near the cap, counted, and never
fatal when the store fails."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from proxy.metrics import Metrics
from proxy.policies.spec import StoreSettings
from proxy.store.activity import Activity
from proxy.store.base import BlobInfo, StoreError, content_ref
from proxy.store.collector import Collector
from proxy.store.local import LocalStore
from proxy.store.retention import Collected, Pressure, StoreStats

MB = 1024 * 1024


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_writes_near_the_cap_start_a_collection_before_the_interval(
    tmp_path: Path,
) -> None:
    settings = StoreSettings(path=str(tmp_path), max_mb=1, live_s=1, gc_interval_s=3600)
    store = LocalStore(str(tmp_path), max_bytes=MB)
    metrics = Metrics()
    collector = Collector(store, Activity(store, lambda _: None, live_s=1), settings, metrics)
    running = asyncio.create_task(collector.run())
    try:
        await asyncio.sleep(0.1)  # the collection at start
        idle = time.time() - 60  # written by sessions idle for a minute: none is live
        refs = []
        for n in range(48):  # 3 MB into a 1 MB store
            data = os.urandom(32 * 1024).hex().encode()
            session = f"key:a/s{n}"
            info = BlobInfo(content_ref(session, "tool_result", data), session, "tool_result",
                            len(data), idle + n, "key:a", {})  # fmt: skip
            await store.put(info, data)
            refs.append(info.ref)
            await asyncio.sleep(0.02)
        await asyncio.sleep(1.5)  # at most MIN_GAP_S after the last kick
        stats = await store.stats(live_after=time.time() - 1)
        first, last = await store.get(refs[0]), await store.get(refs[-1])
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await store.close()
    assert stats.size_bytes <= MB, stats.describe()
    assert sample(metrics, "agentproxy_store_sessions_removed_total", reason="evicted") > 0
    assert sample(metrics, "agentproxy_store_size_bytes") <= MB
    assert sample(metrics, "agentproxy_store_max_bytes") == MB
    assert first is None and last is not None  # least recently active first


class Failing:
    def __init__(self) -> None:
        self.pressure = Pressure(None)
        self.calls = 0
        self.over_cap = False

    async def touch(self, sessions: Mapping[str, float]) -> None:
        pass

    async def collect(self, *, expire_before: float, live_after: float) -> Collected:
        self.calls += 1
        if self.calls == 1:
            raise StoreError("redis 127.0.0.1:6379: collect failed: Connection refused")
        return Collected(over_cap=self.over_cap)

    async def stats(self, *, live_after: float) -> StoreStats:
        raise NotImplementedError


async def test_a_failed_collection_is_counted_and_the_next_one_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    retention, metrics = Failing(), Metrics()
    collector = Collector(retention, Activity(retention, lambda _: None, live_s=3600),
                          StoreSettings(), metrics)  # fmt: skip
    assert await collector.collect() is None
    assert await collector.collect() == Collected()
    assert sample(metrics, "agentproxy_store_collections_total", result="failed") == 1
    assert sample(metrics, "agentproxy_store_collections_total", result="ok") == 1
    assert "store collection failed" in caplog.text


async def test_over_the_cap_with_live_sessions_only_is_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    retention, metrics = Failing(), Metrics()
    retention.calls, retention.over_cap = 1, True
    collector = Collector(retention, Activity(retention, lambda _: None, live_s=3600),
                          StoreSettings(), metrics)  # fmt: skip
    with caplog.at_level(logging.WARNING, "agentproxy.store"):
        for _ in range(3):
            await collector.collect()
    assert caplog.text.count("over store.max_mb") == 1
    assert sample(metrics, "agentproxy_store_over_cap") == 1


async def test_the_heap_is_trimmed_once_a_quiet_spell_begins_and_when_sessions_leave(
    tmp_path: Path,
) -> None:
    trims: list[float] = []
    now = [1_000_000.0]
    store = LocalStore(str(tmp_path))
    activity = Activity(store, lambda _: None, live_s=3600, clock=lambda: now[0])
    settings = StoreSettings(path=str(tmp_path))
    collector = Collector(
        store, activity, settings, Metrics(), trim_heap=lambda: trims.append(now[0]) or True
    )
    try:
        cold = activity.arrive("key:a/s1")
        assert cold is not None
        await cold
        collector._trim_when_quiet(False)
        assert trims == [], "a request under way: no trim"
        activity.leave("key:a/s1")
        now[0] += 5
        collector._trim_when_quiet(False)
        assert trims == [], "quiet for 5 s only"
        now[0] += 6
        collector._trim_when_quiet(False)
        collector._trim_when_quiet(False)
        assert len(trims) == 1, "once as the quiet spell begins, not over and over"
        collector._trim_when_quiet(True)
        assert len(trims) == 2, "sessions left memory: their pages go back too"
        activity.arrive("key:a/s1")
        activity.leave("key:a/s1")
        collector._trim_when_quiet(False)
        now[0] += 11
        collector._trim_when_quiet(False)
        assert len(trims) == 3, "a new quiet spell, a new trim"
    finally:
        await store.close()
