"""The rate limits' windows, in process memory and in a real Redis: the same arithmetic (token
buckets refilled continuously, all-or-nothing admissions, slots, a tokens debt), and a memory
bounded by the subjects active lately."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.policies.spec import RateLimits, StoreSettings
from proxy.store.redis import RedisConnection
from proxy.store.redis_windows import RedisWindows
from proxy.store.windows import SWEEP_EVERY, MemoryWindows, Subject, Windows
from tests.conftest import REDIS_URL


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
async def windows(request: Any, redis_prefix: str) -> AsyncIterator[Windows]:
    if request.param == "memory":
        yield MemoryWindows()
        return
    redis = RedisConnection(StoreSettings(backend="redis", url=REDIS_URL, prefix=redis_prefix))
    yield RedisWindows(redis, lease_s=60)
    await redis.close()


async def test_a_refusal_takes_from_no_subject(windows: Windows) -> None:
    roomy = Subject("roomy", RateLimits(rpm=10))
    tight = Subject("tight", RateLimits(rpm=1))
    assert await windows.take([roomy, tight], "a", 1) is None
    refused = await windows.take([roomy, tight], "b", 1)
    assert refused is not None and refused.index == 1 and refused.limit == "rpm"
    assert 59 <= refused.retry_after_s <= 60  # one request a minute, just taken
    # The roomy bucket lost only the admitted request: nine more pass.
    for n in range(9):
        assert await windows.take([roomy], f"c{n}", 1) is None
    assert await windows.take([roomy], "d", 1) is not None


async def test_slots_are_held_until_given_back(windows: Windows) -> None:
    two = Subject("two", RateLimits(max_concurrent=2))
    assert await windows.take([two], "a", 1) is None
    assert await windows.take([two], "b", 1) is None
    refused = await windows.take([two], "c", 1)
    assert refused is not None and refused.limit == "max_concurrent"
    await windows.give_back([two], "a", 0)
    assert await windows.take([two], "c", 1) is None
    assert await windows.take([two], "d", 1) is not None


async def test_tokens_are_charged_on_the_estimate_then_corrected(windows: Windows) -> None:
    tpm = Subject("tpm", RateLimits(tpm=1000))
    assert await windows.take([tpm], "a", 600) is None
    refused = await windows.take([tpm], "b", 600)
    assert refused is not None and refused.limit == "tpm"
    assert 11 <= refused.retry_after_s <= 12.1  # 200 short at 1000 a minute
    await windows.give_back([tpm], "a", 500)  # it used 100 of its 600
    assert await windows.take([tpm], "b", 600) is None
    await windows.give_back([tpm], "b", -600)  # it used 1,200 of the 900 left: 300 owed
    refused = await windows.take([tpm], "c", 10)
    assert refused is not None and 18 <= refused.retry_after_s <= 18.7  # 310 at 1000 a minute


async def test_a_request_larger_than_the_minute_passes_on_a_full_bucket() -> None:
    clock = Clock()
    windows = MemoryWindows(clock)
    tpm = Subject("tpm", RateLimits(tpm=100))
    assert await windows.take([tpm], "a", 250) is None  # full: let through, 150 owed
    refused = await windows.take([tpm], "b", 250)
    assert refused is not None and refused.retry_after_s == pytest.approx(150.0)
    clock.now += 150
    assert await windows.take([tpm], "b", 250) is None


async def test_buckets_refill_continuously() -> None:
    clock = Clock()
    windows = MemoryWindows(clock)
    rpm = Subject("rpm", RateLimits(rpm=60))
    for n in range(60):
        assert await windows.take([rpm], str(n), 1) is None
    refused = await windows.take([rpm], "x", 1)
    assert refused is not None and refused.retry_after_s == pytest.approx(1.0)
    clock.now += 1.0
    assert await windows.take([rpm], "x", 1) is None
    assert await windows.take([rpm], "y", 1) is not None


async def test_memory_keeps_only_the_subjects_active_lately() -> None:
    clock = Clock()
    windows = MemoryWindows(clock)
    held = Subject("held", RateLimits(max_concurrent=5))
    assert await windows.take([held], "h", 1) is None
    for n in range(SWEEP_EVERY - 2):
        assert await windows.take([Subject(f"s{n}", RateLimits(rpm=10))], "x", 1) is None
    assert len(windows) == SWEEP_EVERY - 1  # no sweep yet
    clock.now += 61  # every rpm bucket is full again
    assert await windows.take([Subject("new", RateLimits(rpm=10))], "x", 1) is None  # sweeps
    assert len(windows) == 2  # the one in flight and the newest stay


async def test_memory_holds_at_most_max_subjects_keeping_those_in_flight() -> None:
    clock = Clock()
    windows = MemoryWindows(clock, max_subjects=100)
    slot = Subject("slot", RateLimits(max_concurrent=1))
    assert await windows.take([slot], "h", 1) is None
    for n in range(300):  # a flood of new sessions within one minute, none idle yet
        assert await windows.take([Subject(f"s{n}", RateLimits(rpm=10))], "x", 1) is None
        assert len(windows) <= 101
    refused = await windows.take([slot], "again", 1)  # the slot in flight was kept
    assert refused is not None and refused.limit == "max_concurrent"
