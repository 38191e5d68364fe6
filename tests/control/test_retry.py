"""The one retry loop, with a fake clock: exact waits, no real sleeping."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from proxy.control.outcome import CircuitOpen
from proxy.control.retry import with_retries
from proxy.errors import UpstreamUnreachable
from proxy.exchange import Recovery
from proxy.policies.spec import ErrorClass, RetrySpec
from proxy.upstream.base import UpstreamHTTPError
from tests.control.fakes import Clock


def failing(*errors: Exception) -> tuple[Callable[[int], Awaitable[str]], list[int]]:
    """An attempt raising `errors` in turn, then answering "ok"; and the attempt numbers seen."""
    seen: list[int] = []
    queue = list(errors)

    async def attempt(number: int) -> str:
        seen.append(number)
        if queue:
            raise queue.pop(0)
        return "ok"

    return attempt, seen


def status(code: int, **headers: str) -> UpstreamHTTPError:
    return UpstreamHTTPError(code, b"{}", headers)


async def test_transient_failures_back_off_then_succeed() -> None:
    clock, recovery = Clock(), Recovery()
    attempt, seen = failing(status(503), UpstreamUnreachable("reset"))
    retried: list[tuple[ErrorClass, float]] = []
    result = await with_retries(
        attempt, RetrySpec(), recovery, clock.timing(), on_retry=lambda k, d: retried.append((k, d))
    )
    assert result == "ok" and seen == [1, 2, 3]
    assert clock.slept == [0.5, 1.0]  # base 0.5, factor 2 (jitter off)
    assert retried == [("transient", 0.5), ("transient", 1.0)]
    assert recovery.recoveries() == ["retry x2"]


async def test_logical_errors_are_not_retried() -> None:
    clock, recovery = Clock(), Recovery()
    attempt, seen = failing(status(400))
    with pytest.raises(UpstreamHTTPError):
        await with_retries(attempt, RetrySpec(), recovery, clock.timing())
    assert seen == [1] and clock.slept == [] and recovery.last_class == "logical"


async def test_attempts_are_calls_in_all() -> None:
    clock, recovery = Clock(), Recovery()
    attempt, seen = failing(*[status(503)] * 10)
    with pytest.raises(UpstreamHTTPError):
        await with_retries(attempt, RetrySpec(attempts=4, cap_s=1.5), recovery, clock.timing())
    assert seen == [1, 2, 3, 4]
    assert clock.slept == [0.5, 1.0, 1.5]
    assert recovery.guidance == "all 4 attempts failed; raise retry.attempts or add a fallback"


async def test_retry_after_is_honoured_exactly() -> None:
    clock = Clock()
    attempt, seen = failing(
        status(429, **{"Retry-After": "3"}), status(503, **{"retry-after-ms": "40"})
    )
    await with_retries(attempt, RetrySpec(), Recovery(), clock.timing())
    assert clock.slept == [3.0, 0.04] and seen == [1, 2, 3]


async def test_a_hint_longer_than_the_cap_means_no_retry() -> None:
    clock, recovery = Clock(), Recovery()
    attempt, seen = failing(status(429, **{"retry-after": "120"}))
    with pytest.raises(UpstreamHTTPError) as caught:
        await with_retries(attempt, RetrySpec(retry_after_cap_s=60), recovery, clock.timing())
    assert seen == [1] and clock.slept == []
    assert caught.value.headers["retry-after"] == "120"
    assert recovery.guidance is not None and "retry.retry_after_cap_s (60s)" in recovery.guidance


async def test_never_sleeps_past_the_deadline() -> None:
    clock, recovery = Clock(), Recovery()
    recovery.deadline = clock.now + 1.2
    attempt, seen = failing(status(503), status(503), status(503))
    with pytest.raises(UpstreamHTTPError):
        await with_retries(attempt, RetrySpec(), recovery, clock.timing())
    assert clock.slept == [0.5]  # 0.5 + 1.0 would end past 1.2
    assert seen == [1, 2]
    assert recovery.guidance is not None and "retry.deadline_s" in recovery.guidance


async def test_an_open_circuit_is_not_waited_out() -> None:
    clock = Clock()
    attempt, seen = failing(CircuitOpen("sim", 5, 30.0))
    with pytest.raises(CircuitOpen):
        await with_retries(attempt, RetrySpec(), Recovery(), clock.timing())
    assert seen == [1] and clock.slept == []


async def test_bugs_are_never_retried() -> None:
    clock, recovery = Clock(), Recovery()
    attempt, seen = failing(KeyError("oops"))
    with pytest.raises(KeyError):
        await with_retries(attempt, RetrySpec(), recovery, clock.timing())
    assert seen == [1] and recovery.last_class is None


async def test_classify_overrides_make_a_status_retryable() -> None:
    clock = Clock()
    attempt, seen = failing(status(409))
    spec = RetrySpec(classify={409: "transient"})
    assert await with_retries(attempt, spec, Recovery(), clock.timing()) == "ok"
    assert seen == [1, 2]


async def test_a_single_attempt_policy_never_retries() -> None:
    clock, recovery = Clock(), Recovery()
    attempt, seen = failing(status(503))
    with pytest.raises(UpstreamHTTPError):
        await with_retries(attempt, RetrySpec(attempts=1), recovery, clock.timing())
    assert seen == [1] and recovery.guidance is None
