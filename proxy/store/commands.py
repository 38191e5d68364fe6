"""`agentproxy store stats | gc`: the store's size and sessions, and a collection now.

Safe next to a running proxy: the embedded store takes one writer at a time and a collection
checks each session's activity in the same transaction that deletes it (Redis: in the same
script); a session is live to it exactly as to the proxy (`store.live_s`).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from proxy.metrics import Metrics
from proxy.policies.spec import StoreSettings
from proxy.store.backends import open_backends
from proxy.store.retention import Collected, StoreStats


async def stats(settings: StoreSettings) -> StoreStats:
    backends = open_backends(settings, Metrics())
    try:
        return await backends.retention.stats(live_after=time.time() - settings.live_s)
    finally:
        await backends.store.close()
        await backends.state.close()


async def collect(settings: StoreSettings) -> Collected:
    backends = open_backends(settings, Metrics())
    now = time.time()
    try:
        return await backends.retention.collect(
            expire_before=now - settings.session_ttl_s, live_after=now - settings.live_s
        )
    finally:
        await backends.store.close()
        await backends.state.close()


def describe_stats(found: StoreStats, settings: StoreSettings) -> list[str]:
    cap = "none" if found.max_bytes is None else _mb(found.max_bytes)
    lines = [
        f"backend        {found.backend}",
        f"size           {_mb(found.size_bytes)} of {cap} (store.max_mb)",
        f"payload        {_mb(found.payload_bytes)} in {found.blobs} blobs, "
        f"{found.checkpoints} checkpoints",
        f"sessions       {found.sessions}, {found.live_sessions} live "
        f"(active in the last {settings.live_s:g}s)",
        f"oldest active  {_when(found.oldest_activity)}; "
        f"sessions expire {settings.session_ttl_s:g}s after their last request",
    ]
    lines += [f"{name:<15}{value}" for name, value in found.details.items()]
    return lines


def describe_collected(done: Collected) -> list[str]:
    lines = [
        f"expired  {len(done.expired)} session(s) idle past store.session_ttl",
        f"evicted  {len(done.evicted)} session(s) for store.max_mb",
        f"size     {_mb(done.bytes_before)} -> {_mb(done.bytes_after)}",
    ]
    if done.over_cap:
        lines.append("still over store.max_mb: every session left is live (store.live_s)")
    return lines


def _mb(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MiB"


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
