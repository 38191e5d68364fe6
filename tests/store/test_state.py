"""Every StateStore behaves alike; Redis' counters are atomic across processes, and an
unreachable Redis fails fast and comes back."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from proxy.policies.spec import StoreSettings
from proxy.store.base import StoreError
from proxy.store.redis import RedisConnection, RedisState
from proxy.store.state import MemoryState, StateStore
from tests.conftest import REDIS_URL, OwnRedis, free_port, start_redis


def connect(prefix: str, url: str = REDIS_URL, timeout_s: float = 0.5) -> RedisConnection:
    return RedisConnection(
        StoreSettings(backend="redis", url=url, prefix=prefix, timeout_s=timeout_s)
    )


@pytest.fixture(params=["memory", "redis"])
async def state(request: pytest.FixtureRequest) -> AsyncIterator[StateStore]:
    backend: StateStore
    if request.param == "redis":
        backend = RedisState(connect(request.getfixturevalue("redis_prefix")))
    else:
        backend = MemoryState()
    yield backend
    await backend.close()


async def test_values_are_set_read_expired_and_deleted(state: StateStore) -> None:
    assert await state.get("loops", "s1") is None
    await state.set("loops", "s1", b"level 1")
    await state.set("loops", "s2", b"short-lived", ttl_s=0.05)
    assert await state.get("loops", "s1") == b"level 1"
    assert await state.get("other", "s1") is None  # spaces do not mix
    await asyncio.sleep(0.1)
    assert await state.get("loops", "s2") is None
    await state.delete("loops", "s1")
    assert await state.get("loops", "s1") is None


async def test_counters_add_up_and_first_values_stick(state: StateStore) -> None:
    assert await state.counters("budget", "b|session|s1|0") == {}
    await state.add("budget", "b|session|s1|0", {"calls": 1, "cost_usd": 0.25}, first={"at": 5})
    after = await state.add("budget", "b|session|s1|0", {"calls": 1}, first={"at": 9})
    assert after == {"calls": 2.0, "cost_usd": 0.25, "at": 5.0}
    assert await state.counters("budget", "b|session|s1|0") == after


async def test_published_facts_expire(state: StateStore) -> None:
    await state.publish("circuits", "sim#0", 123.5, ttl_s=30)
    await state.publish("circuits", "sim#1", 1.0, ttl_s=0.05)
    await asyncio.sleep(0.1)
    assert await state.published("circuits") == {"sim#0": 123.5}


async def test_redis_counters_count_every_addition_once_across_connections(
    redis_prefix: str,
) -> None:
    # Two connections stand for two proxy processes charging the same budget at once. A roomy
    # timeout: this is about atomicity, and 200 connections at once on a busy machine are slow.
    first = RedisState(connect(redis_prefix, timeout_s=10))
    second = RedisState(connect(redis_prefix, timeout_s=10))
    try:
        adds = [
            replica.add("budget", "shared", {"calls": 1, "prompt_tokens": 10})
            for _ in range(100)
            for replica in (first, second)
        ]
        await asyncio.gather(*adds)
        assert await first.counters("budget", "shared") == {"calls": 200, "prompt_tokens": 2000}
    finally:
        await first.close()
        await second.close()


async def test_unreachable_redis_fails_fast_with_a_clear_error() -> None:
    state = RedisState(connect("x:", url=f"redis://127.0.0.1:{free_port()}/0"))
    try:
        started = time.perf_counter()
        with pytest.raises(StoreError, match=r"redis redis://127\.0\.0\.1:\d+/0: state_get failed"):
            await state.get("loops", "s1")
        assert time.perf_counter() - started < 1.5
        started = time.perf_counter()
        with pytest.raises(StoreError, match="skipped, not answering"):
            await state.get("loops", "s1")  # within the pause: no connection attempt at all
        assert time.perf_counter() - started < 0.05
    finally:
        await state.close()


async def test_state_comes_back_when_redis_does(
    own_redis: OwnRedis,
) -> None:
    port, processes = own_redis
    start_redis(port, processes)
    state = RedisState(connect("t:", url=f"redis://127.0.0.1:{port}/0"))
    try:
        await _eventually(lambda: state.set("loops", "s1", b"1"))
        processes[0].terminate()
        processes[0].wait(5)
        with pytest.raises(StoreError):
            await state.get("loops", "s1")
        start_redis(port, processes)
        await _eventually(lambda: state.set("loops", "s1", b"2"))
        assert await state.get("loops", "s1") == b"2"
    finally:
        await state.close()


async def _eventually(operation: Callable[[], Awaitable[None]], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            await operation()
            return
        except StoreError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_redis_state_without_its_own_ttl_expires_with_the_session_ttl(
    redis_prefix: str,
) -> None:
    settings = StoreSettings(
        backend="redis", url=REDIS_URL, prefix=redis_prefix, session_ttl_s=0.05
    )
    state = RedisState(RedisConnection(settings))
    try:
        await state.set("loops", "s1", b"level")  # no TTL of its own: store.session_ttl applies
        await state.add("budget", "lifetime", {"calls": 1})
        await state.add("budget", "key-lifetime", {"calls": 1}, ttl_s=math.inf)  # kept
        await asyncio.sleep(0.15)
        assert await state.get("loops", "s1") is None
        assert await state.counters("budget", "lifetime") == {}
        assert await state.counters("budget", "key-lifetime") == {"calls": 1.0}
    finally:
        await state.close()


async def test_memory_state_drops_expired_entries_rather_than_hiding_them() -> None:
    """A process that sees sessions come and go holds only the live ones' facts: expired
    entries nobody reads again still go, a few with every write."""
    state = MemoryState()
    await state.set("guards", "key:a/kept", b"{}")  # no ttl: the oldest, and it stays
    for n in range(100):
        await state.set("guards", f"key:a/s{n}", b"{}", ttl_s=0.05)
        await state.add("budget", f"b|session|key:a/s{n}", {"calls": 1}, ttl_s=0.05)
    await asyncio.sleep(0.1)
    for n in range(100):  # new sessions arrive
        await state.set("guards", f"key:a/new{n}", b"{}")
        await state.add("budget", f"b|session|key:a/new{n}", {"calls": 1})
    values, counters = state.memos().values()
    assert not any(key[1].startswith("key:a/s") for key in values), "expired: dropped"
    assert len(values) == 101 and len(counters) == 100


async def test_memory_state_is_bounded_by_bytes_least_recently_used_first() -> None:
    state = MemoryState(max_bytes=64 * 1024)
    await state.set("guards", "key:a/first", b"{}")
    for n in range(200):  # ~90 KB of guard records into a 32 KB half
        await state.set("guards", f"key:a/s{n}", b"x" * 64)
        assert await state.get("guards", "key:a/first") == b"{}"  # used: kept
    assert await state.get("guards", "key:a/s0") is None
    assert await state.get("guards", "key:a/s199") == b"x" * 64
    values, _ = state.memos().values()
    assert values.currsize <= 32 * 1024
    await state.set("guards", "key:a/huge", b"x" * 64 * 1024)  # larger than the bound:
    assert await state.get("guards", "key:a/huge") is None  # forgotten, not an error
