"""The background collection: expire idle sessions, keep the store under its cap.

Every `gc_interval_s`, and early when writes may have brought the store near its cap
(retention.Pressure), it deletes sessions idle past `session_ttl`, then evicts whole
sessions least recently active first while over `max_mb`, never a live one. More often (an
eighth of `live_s` or a quarter of `memo_idle_s`, at most every 10 s) it flushes the sessions'
activity to the store and forgets the ones gone idle (proxy/store/activity.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from proxy.metrics import Metrics
from proxy.policies.spec import StoreSettings
from proxy.store.activity import Activity
from proxy.store.base import StoreError
from proxy.store.retention import Collected, Retention

log = logging.getLogger("agentproxy.store")

MAX_FLUSH_EVERY_S = 10.0
# Between kicked collections once one could not get under the cap (only live sessions left)
# or failed: each write would kick another at once.
MIN_GAP_S = 1.0
# A heap trim waits until no request has been under way for this long: under load one costs
# 3-8 ms (~430 MB process) and what it returns is soon taken again (proxy/runtime/heap.py).
QUIET_BEFORE_TRIM_S = 10.0


class Collector:
    def __init__(
        self,
        retention: Retention,
        activity: Activity,
        settings: StoreSettings,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
        trim_heap: Callable[[], bool] = lambda: False,
    ) -> None:
        self.retention = retention
        self.activity = activity
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        # Gives the process's free heap pages back, True when it ran (the app's: runtime/heap.py).
        self.trim_heap = trim_heap
        # Often enough that a session goes from memory within a fraction of its idle time.
        self.flush_every_s = min(MAX_FLUSH_EVERY_S, settings.live_s / 8, activity.idle_s / 4)
        self._due = asyncio.Event()
        self._over_cap = False
        self._trimmed = False  # during this quiet spell
        metrics.store_max_bytes.set(
            settings.max_mb * 1024 * 1024 if settings.max_mb is not None else 0
        )

    def kick(self) -> None:
        """Collect soon (writes may have brought the store near its cap)."""
        self._due.set()

    async def run(self) -> None:
        """Until cancelled: flush and sweep often, collect every gc_interval_s or when
        kicked. The first collection runs at once (a store may have aged while down)."""
        self.retention.pressure.kick = self.kick
        self._due.set()
        calm_after = next_collection = 0.0
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.flush_every_s):
                        await self._due.wait()
                if self._due.is_set():
                    await asyncio.sleep(max(0.0, calm_after - time.monotonic()))
                await self.activity.flush()
                forgotten = self.activity.sweep()
                self._trim_when_quiet(bool(forgotten))
                if self._due.is_set() or time.monotonic() >= next_collection:
                    self._due.clear()
                    done = await self.collect()
                    now = time.monotonic()
                    stuck = done is None or done.over_cap
                    calm_after = now + MIN_GAP_S if stuck else now
                    wait = self.settings.gc_interval_s if done else self.flush_every_s
                    next_collection = now + wait
        finally:
            self.retention.pressure.kick = None

    def _trim_when_quiet(self, forgot: bool) -> None:
        """Give free pages back once a quiet spell begins, and again whenever sessions leave
        memory during it; not while requests come, nor over and over for nothing."""
        if self.activity.quiet_for() < QUIET_BEFORE_TRIM_S:
            self._trimmed = False
        elif (forgot or not self._trimmed) and self.trim_heap():
            self._trimmed = True

    async def collect(self) -> Collected | None:
        """One collection now; None (logged and counted) when the store failed."""
        m = self.metrics
        await self.activity.flush()
        now = self.clock()
        started = time.monotonic()
        try:
            done = await self.retention.collect(
                expire_before=now - self.settings.session_ttl_s,
                live_after=now - self.settings.live_s,
            )
        except StoreError as exc:
            m.child(m.store_collections, "failed").inc()
            log.warning("store collection failed, retried in %gs: %s", self.flush_every_s, exc)
            return None
        m.child(m.store_collections, "ok").inc()
        m.child(m.store_sessions_removed, "expired").inc(len(done.expired))
        m.child(m.store_sessions_removed, "evicted").inc(len(done.evicted))
        m.store_size_bytes.set(done.bytes_after)
        m.store_over_cap.set(1 if done.over_cap else 0)
        if done.removed:
            log.info(
                "store: %d session(s) expired, %d evicted for the cap; %.1f MB -> %.1f MB "
                "in %.0f ms",
                len(done.expired), len(done.evicted),
                done.bytes_before / 1e6, done.bytes_after / 1e6,
                (time.monotonic() - started) * 1000,
            )  # fmt: skip
        if done.over_cap and not self._over_cap:
            log.warning(
                "store is over store.max_mb (%.1f MB) with live sessions only: nothing was "
                "evicted that a live session names; raise max_mb or lower live_s",
                done.bytes_after / 1e6,
            )
        self._over_cap = done.over_cap
        return done
