"""The index of recorded sessions in each backend: a turn's figures count once, with its record
and only when the record is new; an owner lists its own entries only; turns not recorded reach
only a session the store holds; and an entry goes with its session (collection)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.policies.spec import StoreSettings
from proxy.store.base import RECORD_TURN, BlobInfo, Store, content_ref
from proxy.store.listing import Listed
from proxy.store.local import LocalStore
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisConnection, RedisStore
from tests.conftest import REDIS_URL


@pytest.fixture(params=["memory", "local", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    backend: Store
    if request.param == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        redis = RedisConnection(StoreSettings(backend="redis", url=REDIS_URL, prefix=prefix))
        backend = RedisStore(redis)
    else:
        backend = MemoryStore() if request.param == "memory" else LocalStore(str(tmp_path))
    yield backend
    await backend.close()
    if request.param == "redis":
        await redis.close()


def turn(session: str, n: int, at: float, **figures: int) -> tuple[BlobInfo, bytes, Listed]:
    owner, _, name = session.partition("/")
    data = f'{{"seq": {n}}}'.encode()
    info = BlobInfo(content_ref(session, RECORD_TURN, data), session, RECORD_TURN, len(data),
                    at, owner, {"seq": n})  # fmt: skip
    listed = Listed(session, name, owner, owner.partition(":")[2], "sim", "recorded", turns=1,
                    cost_usd=0.25, statuses={"200": 1}, first_at=at, last_at=at,
                    **figures)  # fmt: skip
    return info, data, listed


async def write(store: Store, *turns: tuple[BlobInfo, bytes, Listed]) -> None:
    await store.put_many([(i, d) for i, d, _ in turns], {i.ref: x for i, _, x in turns})


async def test_a_turn_counts_once_and_owners_list_their_own(store: Store) -> None:
    now = time.time()
    first = turn("key:alice/s1", 0, now - 2, tokens_received=100, tokens_sent=60)
    second = turn("key:alice/s1", 1, now - 1, tokens_received=150, tokens_sent=70)
    await write(store, first)
    await write(store, first, second)  # the first again (a retry): counted once
    await write(store, turn("key:bob/s1", 0, now, tokens_received=5))
    await store.put_listed([Listed("key:carol/s9", "s9", "key:carol", turns=1,
                                   not_recorded={"dropped": 1}, last_at=now)])  # fmt: skip

    (alices,) = await store.listed("key:alice", 100)
    assert (alices.turns, alices.tokens_received, alices.tokens_sent) == (2, 250, 130)
    described = (alices.name, alices.key, alices.statuses, alices.cost_usd)
    assert described == ("s1", "alice", {"200": 2}, 0.5)
    assert (alices.first_at, alices.last_at) == (pytest.approx(now - 2), pytest.approx(now - 1))
    assert [e.session for e in await store.listed("key:bob", 100)] == ["key:bob/s1"]
    everyone = await store.listed(None, 100)
    assert [e.session for e in everyone] == ["key:bob/s1", "key:alice/s1"]  # recent first
    assert await store.listed("key:carol", 100) == []  # a session the store does not hold

    await store.put_listed([Listed("key:alice/s1", "s1", "key:alice", turns=1,
                                   not_recorded={"failed": 1}, last_at=now)])  # fmt: skip
    entry = await store.listed_one("key:alice/s1")
    assert entry is not None and (entry.turns, entry.not_recorded) == (3, {"failed": 1})
    assert entry.errors == 0 and await store.listed_one("key:alice/nothing") is None


async def test_every_owner_keeps_its_share_of_a_listing_of_all(store: Store) -> None:
    """Bob's sessions by the dozen leave alice's in the list of every owner's."""
    now = time.time()
    await write(store, turn("key:alice/a1", 0, now - 100), turn("key:alice/a2", 0, now - 99))
    for n in range(30):
        await write(store, turn(f"key:bob/b{n}", 0, now - 50 + n))
    listed = [e.session for e in await store.listed(None, 10)]
    assert len(listed) == 10 and listed[-2:] == ["key:alice/a2", "key:alice/a1"]
    assert listed[:8] == [f"key:bob/b{n}" for n in range(29, 21, -1)]  # bob's newest
    assert len(await store.listed("key:bob", 100)) == 30


async def test_an_entry_goes_with_its_session(store: Store) -> None:
    if isinstance(store, MemoryStore):
        pytest.skip("the memory store keeps what it is given: it has no collection")
    now = time.time()
    await write(store, turn("key:alice/old", 0, now - 100), turn("key:alice/new", 0, now))
    done = await store.collect(expire_before=now - 50, live_after=now)  # type: ignore[attr-defined]
    assert done.expired == ("key:alice/old",)
    assert [e.session for e in await store.listed("key:alice", 100)] == ["key:alice/new"]
    assert [e.session for e in await store.listed(None, 100)] == ["key:alice/new"]
    assert await store.listed_one("key:alice/old") is None
