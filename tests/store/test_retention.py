"""Retention behaves alike on both backends: expiry by inactivity, a size cap enforced by
evicting whole least recently active sessions, never a live one; the local store gives the
space back to the disk, and Redis keys carry TTLs."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis

from proxy.policies.spec import StoreSettings
from proxy.store.base import BlobInfo, content_ref
from proxy.store.local import LocalStore
from proxy.store.redis import RedisConnection, RedisStore
from proxy.store.retention import StoreFull
from tests.conftest import REDIS_URL

KB = 1024
DAY = 86400.0


def blob(session: str, data: bytes, at: float | None = None) -> BlobInfo:
    ref = content_ref(session, "tool_result", data)
    return BlobInfo(ref, session, "tool_result", len(data), at or time.time(), "key:a", {})


def payload(session: str, n: int, size: int) -> bytes:
    """Incompressible-looking, distinct bytes: each blob really takes its size."""
    return (f"{session}-{n}-".encode() + os.urandom(size // 2).hex().encode())[:size]


Backend = LocalStore | RedisStore


@pytest.fixture(params=["local", "redis"])
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    opened: list[Backend] = []
    connections: list[RedisConnection] = []

    def factory(max_bytes: int | None = None, ttl_s: float = 7 * DAY) -> Backend:
        store: Backend
        if request.param == "redis":
            prefix = request.getfixturevalue("redis_prefix")
            settings = StoreSettings(
                backend="redis", url=REDIS_URL, prefix=prefix, session_ttl_s=ttl_s
            )
            connections.append(RedisConnection(settings))
            store = RedisStore(connections[-1], max_bytes=max_bytes)
        else:
            store = LocalStore(str(tmp_path / "store"), max_bytes=max_bytes)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()
    for connection in connections:
        await connection.close()


async def fill(store: Backend, session: str, blobs: int, size: int, at: float) -> list[str]:
    refs = []
    for n in range(blobs):
        data = payload(session, n, size)
        info = blob(session, data, at)
        await store.put(info, data)
        refs.append(info.ref)
    await store.touch({session: at})
    return refs


def file_size(file: str) -> int:
    return Path(file).stat().st_size


async def found(store: Backend, refs: list[str]) -> list[bool]:
    return [await store.get(ref) is not None for ref in refs]


async def age(store: Backend, session: str, at: float) -> None:
    """Make a session's last activity `at` (a checkpoint write counts as activity now)."""
    if isinstance(store, RedisStore):
        r = store.redis
        await r.client.zadd(r.key("sessions"), {session: at})
    else:
        db = sqlite3.connect(store.file)
        with db:
            db.execute("UPDATE sessions SET last_active = ? WHERE session = ?", (at, session))
        db.close()


async def test_expired_sessions_are_gone_and_active_ones_stay(make: Any) -> None:
    store = make()
    now = time.time()
    old = await fill(store, "key:a/old", 3, 2 * KB, now - 8 * DAY)
    await store.put_checkpoint("key:a/old", "index", b"{}")
    await age(store, "key:a/old", now - 8 * DAY)
    fresh = await fill(store, "key:a/fresh", 3, 2 * KB, now)
    await store.put_checkpoint("key:a/fresh", "index", b"{}")

    done = await store.collect(expire_before=now - 7 * DAY, live_after=now - 3600)

    assert done.expired == ("key:a/old",) and done.evicted == ()
    assert [await store.get(ref) for ref in old] == [None] * 3
    assert await store.blobs("key:a/old") == []
    assert await store.get_checkpoint("key:a/old", "index") is None
    assert all(await found(store, fresh))
    assert await store.get_checkpoint("key:a/fresh", "index") == b"{}"
    stats = await store.stats(live_after=now - 3600)
    assert (stats.sessions, stats.blobs, stats.checkpoints) == (1, 3, 1)


async def test_the_cap_evicts_whole_sessions_least_recently_active_first(make: Any) -> None:
    store = make(max_bytes=400 * KB)
    now = time.time()
    sessions = [f"key:a/s{n}" for n in range(10)]
    refs = {}
    for n, session in enumerate(sessions):  # s0 least recently active … s9 most
        refs[session] = await fill(store, session, 8, 8 * KB, now - 3 * 3600 + n * 60)

    done = await store.collect(expire_before=now - 7 * DAY, live_after=now - 3600)

    assert done.evicted, "640 KB written under a 400 KB cap: something must go"
    assert done.bytes_after <= 400 * KB and not done.over_cap
    assert len(done.evicted) < len(sessions), "down to the low-water mark, not to nothing"
    # The oldest went first, and whole: a kept session has every blob.
    kept = [s for s in sessions if s not in done.evicted]
    assert list(done.evicted) == sessions[: len(done.evicted)]
    for session in kept:
        assert all(await found(store, refs[session]))
    for session in done.evicted:
        assert await store.blobs(session) == []
        assert not any(await found(store, refs[session]))


async def test_live_sessions_are_never_evicted_even_over_the_cap(make: Any) -> None:
    store = make(max_bytes=200 * KB)
    now = time.time()
    live = [await fill(store, f"key:a/live{n}", 8, 8 * KB, now - n) for n in range(4)]
    idle = await fill(store, "key:a/idle", 8, 8 * KB, now - 2 * 3600)

    done = await store.collect(expire_before=now - 7 * DAY, live_after=now - 3600)

    assert done.evicted == ("key:a/idle",)
    assert not any(await found(store, idle))
    assert done.over_cap  # 256 KB of live sessions under a 200 KB cap: said, not hidden
    for refs in live:
        assert all(await found(store, refs))


async def test_a_session_touched_since_is_not_removed(make: Any) -> None:
    store = make()
    now = time.time()
    refs = await fill(store, "key:a/back", 2, KB, now - 8 * DAY)
    await store.touch({"key:a/back": now})  # it came back before the collection ran
    done = await store.collect(expire_before=now - 7 * DAY, live_after=now - 3600)
    assert done.expired == ()
    assert all(await found(store, refs))


async def test_touch_ignores_sessions_without_data(make: Any) -> None:
    store = make()
    now = time.time()
    await store.touch({"key:a/never-stored": now})
    assert (await store.stats(live_after=now - 3600)).sessions == 0


async def test_checkpoint_rewrites_are_counted_once(make: Any) -> None:
    store = make()
    now = time.time()
    await store.put_checkpoint("key:a/s", "index", b"x" * 1000)
    await store.put_checkpoint("key:a/s", "index", b"x" * 300)  # replaced, smaller
    await store.put_checkpoint("key:a/s", "c1", b"y" * 200)
    await store.put(blob("key:a/s", b"z" * 500), b"z" * 500)
    await store.put(blob("key:a/s", b"z" * 500), b"z" * 500)  # the same ref: a no-op
    stats = await store.stats(live_after=now - 3600)
    assert stats.payload_bytes == 300 + 200 + 500
    assert stats.live_sessions == 1


# -- the local store gives space back ---------------------------------------------------------


async def test_local_collection_shrinks_the_file(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path), max_bytes=256 * KB)
    now = time.time()
    try:
        for n in range(40):
            await fill(store, f"key:a/s{n}", 4, 16 * KB, now - 2 * 3600 + n)
        grown = file_size(store.file)
        assert grown > 2 * 1024 * KB
        done = await store.collect(expire_before=now - 7 * DAY, live_after=now - 3600)
        stats = await store.stats(live_after=now - 3600)
    finally:
        await store.close()
    assert done.bytes_after <= 256 * KB
    on_disk = stats.details["file_bytes"]
    assert isinstance(on_disk, int) and on_disk <= 256 * KB, stats.describe()
    assert file_size(store.file) < grown / 4


async def test_an_older_local_store_is_converted_and_its_sessions_counted(tmp_path: Path) -> None:
    file = tmp_path / "store.sqlite3"
    db = sqlite3.connect(file)  # the layout before retention: no sessions, no auto_vacuum
    db.executescript(
        """
        CREATE TABLE blobs (ref TEXT PRIMARY KEY, session TEXT NOT NULL, kind TEXT NOT NULL,
            size INTEGER NOT NULL, created_at REAL NOT NULL, owner TEXT, meta TEXT NOT NULL,
            data BLOB NOT NULL);
        CREATE TABLE checkpoints (session TEXT NOT NULL, key TEXT NOT NULL, data BLOB NOT NULL,
            PRIMARY KEY (session, key));
        INSERT INTO blobs VALUES ('ap_1', 'key:a/old', 'tool_result', 3, 1000.0, NULL, '{}',
            X'616263');
        INSERT INTO checkpoints VALUES ('key:a/old', 'index', X'7b7d');
        """
    )
    db.commit()
    db.close()
    store = LocalStore(str(tmp_path))
    try:
        stats = await store.stats(live_after=time.time() - 3600)
        assert (stats.sessions, stats.payload_bytes, stats.oldest_activity) == (1, 5, 1000.0)
        done = await store.collect(expire_before=time.time() - 7 * DAY, live_after=time.time())
        assert done.expired == ("key:a/old",)
    finally:
        await store.close()
    check = sqlite3.connect(file)
    assert check.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    check.close()


# -- Redis keys expire by themselves ------------------------------------------------------------


async def test_redis_keys_get_the_session_ttl_and_touches_push_it_back(redis_prefix: str) -> None:
    settings = StoreSettings(backend="redis", url=REDIS_URL, prefix=redis_prefix)
    connection = RedisConnection(settings)
    store = RedisStore(connection)
    raw = redis.Redis.from_url(REDIS_URL)
    info = blob("key:a/s", b"payload")
    try:
        await store.put(info, b"payload")
        await store.put_checkpoint("key:a/s", "index", b"{}")
        keys = [f"{redis_prefix}{k}" for k in ("blob:" + info.ref, "blobs:key:a/s", "ckpt:key:a/s")]
        for key in keys:  # the default: 7 days
            assert 7 * DAY * 1000 - 60_000 < raw.pttl(key) <= 7 * DAY * 1000
        for key in keys:  # a day passes without a request
            raw.pexpire(key, int(6 * DAY * 1000))
        await store.touch({"key:a/s": time.time()})
        for key in keys:
            assert raw.pttl(key) > 7 * DAY * 1000 - 60_000
    finally:
        raw.close()
        await store.close()
        await connection.close()


async def test_at_the_cap_with_only_live_sessions_a_write_is_refused_not_an_eviction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from proxy.store import retention

    monkeypatch.setattr(retention, "ROOM_WAIT_S", 0.3)
    store = LocalStore(str(tmp_path), max_bytes=512 * KB)
    collections: list[Any] = []

    def kick() -> None:  # what the collector does, every session live
        now = time.time()
        collections.append(
            asyncio.ensure_future(store.collect(expire_before=0, live_after=now - 3600))
        )

    store.pressure.kick = kick
    written: list[str] = []
    try:
        with pytest.raises(StoreFull, match=r"at store\.max_mb"):
            for n in range(100):
                session = f"key:a/live{n}"
                written += await fill(store, session, 1, 16 * KB, time.time())
        await asyncio.gather(*collections)
        assert all(await found(store, written)), "no live session lost anything"
        assert file_size(store.file) <= 512 * KB
        stored = await store.get(written[0])
        assert stored is not None
        await store.put(*stored)  # already there: it adds nothing, so it is not refused
    finally:
        await store.close()


async def test_once_only_live_sessions_are_left_writes_are_refused_at_once(
    tmp_path: Path,
) -> None:
    """Waiting at the cap helps only if a collection can make room: once one found only live
    sessions, a write is refused without waiting (it kicks another collection), and writes
    succeed again as soon as a collection has made room."""
    store = LocalStore(str(tmp_path), max_bytes=512 * KB)
    live_after = [time.time() - 3600]  # every session live
    collections: list[Any] = []

    def kick() -> None:
        collections.append(
            asyncio.ensure_future(store.collect(expire_before=0, live_after=live_after[0]))
        )

    store.pressure.kick = kick
    try:
        with pytest.raises(StoreFull):
            for n in range(100):
                await fill(store, f"key:a/live{n}", 1, 16 * KB, time.time())
        await asyncio.gather(*collections)
        assert store.pressure.full
        started = time.monotonic()
        for n in range(20):
            with pytest.raises(StoreFull, match="only live sessions left"):
                await fill(store, f"key:a/more{n}", 1, 16 * KB, time.time())
        assert time.monotonic() - started < 1.0, "each refusal waited for collections"

        live_after[0] = time.time() + 1  # the sessions stop being live: evictable
        kick()
        await asyncio.gather(*collections)
        assert not store.pressure.full
        assert await fill(store, "key:a/after", 1, 16 * KB, time.time())
    finally:
        await asyncio.gather(*collections, return_exceptions=True)
        await store.close()
