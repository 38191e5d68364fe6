"""Owners' shares of the store, alike on both backends: each owner's bytes are counted as its
sessions are written and removed; a write past its owner's share evicts that owner's own idle
sessions first, least recently active first, and is refused only when the owner's sessions are
all live; nobody else's data or writes are touched."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from proxy.policies.spec import ApiKey, Keys, StoreSettings
from proxy.store.local import LocalStore
from proxy.store.redis import RedisConnection, RedisStore
from proxy.store.shares import OwnerFull, owner_share, session_owner
from tests.conftest import REDIS_URL
from tests.store.test_retention import DAY, KB, age, fill, found

Backend = LocalStore | RedisStore
MAX = 1024 * KB


@pytest.fixture(params=["local", "redis"])
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    opened: list[Backend] = []
    connections: list[RedisConnection] = []

    def factory(share: float | None = 0.5, max_bytes: int = MAX) -> Backend:
        store: Backend
        if request.param == "redis":
            prefix = request.getfixturevalue("redis_prefix")
            settings = StoreSettings(backend="redis", url=REDIS_URL, prefix=prefix)
            connections.append(RedisConnection(settings))
            store = RedisStore(connections[-1], max_bytes=max_bytes, owner_share=share)
        else:
            store = LocalStore(str(tmp_path / "store"), max_bytes=max_bytes, owner_share=share)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()
    for connection in connections:
        await connection.close()


async def owners(store: Backend) -> dict[str, int]:
    """Each owner's bytes as the backend counts them (without a scan)."""
    if isinstance(store, RedisStore):
        r = store.redis
        raw = await r.client.hgetall(r.key("owners"))
        counted = {k.decode(): int(v) for k, v in raw.items()}
    else:
        db = sqlite3.connect(store.file)
        counted = dict(db.execute("SELECT owner, bytes FROM owners").fetchall())
        db.close()
    return {owner: size for owner, size in counted.items() if size}


async def test_each_owners_bytes_follow_its_writes_and_removals(make: Any) -> None:
    store = make(share=None)
    now = time.time()
    refs = await fill(store, "key:a/s1", 3, 10 * KB, now)
    await fill(store, "key:a/s2", 1, 5 * KB, now)
    await fill(store, "team:b/s1", 2, 7 * KB, now)
    await store.put_checkpoint("key:a/s1", "index", b"x" * 1000)
    await store.put_checkpoint("key:a/s1", "index", b"x" * 400)  # rewritten: counted once
    stored = await store.get(refs[0])
    assert stored is not None
    await store.put(*stored)  # already there: adds nothing
    assert await owners(store) == {"key:a": 35 * KB + 400, "team:b": 14 * KB}

    await age(store, "key:a/s2", now - 10 * DAY)
    await age(store, "team:b/s1", now - 10 * DAY)
    done = await store.collect(expire_before=now - DAY, live_after=now - 3600)
    assert set(done.expired) == {"key:a/s2", "team:b/s1"}
    assert await owners(store) == {"key:a": 30 * KB + 400}


async def test_a_full_owner_is_refused_and_others_still_write(make: Any) -> None:
    store = make(share=0.5)
    now = time.time()
    written: list[str] = []
    with pytest.raises(OwnerFull, match="key:a holds its share"):
        for n in range(100):  # every session live: nothing of a's may go
            written += await fill(store, f"key:a/live{n}", 1, 32 * KB, now)
    assert 10 <= len(written) <= 16, "a got about half of 1 MiB"
    assert all(await found(store, written)), "no live session lost anything"
    with pytest.raises(OwnerFull):
        await fill(store, "key:a/later", 1, 32 * KB, now)
    theirs = await fill(store, "key:b/s1", 8, 32 * KB, now)  # b's writes are not refused
    assert all(await found(store, theirs))
    again = await store.get(written[0])
    assert again is not None
    await store.put(*again)  # a ref already stored adds nothing: not refused


async def test_a_full_owner_evicts_its_own_idle_sessions_first(make: Any) -> None:
    store = make(share=0.5)
    now = time.time()
    old = now - 2 * 3600  # idle, not live (live_s: an hour)
    theirs = await fill(store, "key:b/idle", 4, 32 * KB, old - 100)  # older than a's
    await age(store, "key:b/idle", old - 100)
    mine_old = []
    for n in range(6):
        mine_old += await fill(store, f"key:a/idle{n}", 2, 32 * KB, old + n)
        await age(store, f"key:a/idle{n}", old + n)
    mine_new: list[str] = []
    for n in range(6):  # past a's share: its own oldest sessions make room
        mine_new += await fill(store, f"key:a/live{n}", 1, 32 * KB, now)
    assert all(await found(store, mine_new)), "every write of a's was taken"
    assert all(await found(store, theirs)), "b's (older) session was not touched"
    kept = await found(store, mine_old)
    assert not kept[0] and not all(kept), "a's least recently active sessions went"
    assert kept == sorted(kept), "oldest first"
    assert (await owners(store))["key:a"] <= MAX // 2


async def test_the_default_share_splits_the_cap_between_the_configured_owners() -> None:
    settings = StoreSettings()

    def keys(*names: str, team: str | None = None) -> Keys:
        return Keys(tuple(ApiKey(n, b"", team) for n in names))

    assert owner_share(settings, Keys()) is None  # open proxy: one tenant
    assert owner_share(settings, keys("a")) is None
    assert owner_share(settings, keys("a", "b")) == 0.5
    assert owner_share(settings, keys(*"abcd")) == 0.25
    assert owner_share(settings, keys(*"abcdefghijklmnopqrstuvwxyz")) == 0.1
    teams = Keys(keys("a", "b", team="t").api_keys, session_scope="team")
    assert owner_share(settings, teams) is None  # one team owns every session
    assert owner_share(StoreSettings(max_owner_share=0.3), keys("a")) == 0.3
    assert owner_share(StoreSettings(max_owner_share=0.3, max_mb=None), keys("a", "b")) is None
    assert session_owner("key:a/s/1") == "key:a" and session_owner("legacy") == ""


async def test_a_redis_session_written_before_owners_were_counted_joins_on_its_next_request(
    redis_prefix: str,
) -> None:
    settings = StoreSettings(backend="redis", url=REDIS_URL, prefix=redis_prefix)
    connection = RedisConnection(settings)
    store = RedisStore(connection, max_bytes=MAX, owner_share=0.5)
    r = store.redis
    try:
        now = time.time()
        await fill(store, "key:a/old", 2, 10 * KB, now - 2 * DAY)
        await fill(store, "key:a/older", 1, 10 * KB, now - 3 * DAY)
        await r.client.delete(r.key("owners"), r.key("owner", "key:a"))  # as before shares
        await store.touch({"key:a/old": now})  # a request: counted from now on
        assert await owners(store) == {"key:a": 20 * KB}
        await fill(store, "key:a/old", 1, 10 * KB, now)
        assert await owners(store) == {"key:a": 30 * KB}
        done = await store.collect(expire_before=now - DAY, live_after=now - 3600)
        assert done.expired == ("key:a/older",)  # never counted: not subtracted either
        assert await owners(store) == {"key:a": 30 * KB}
    finally:
        await store.close()
        await connection.close()
