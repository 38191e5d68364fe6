"""The proxy's one retry loop (litellm's and the SDKs' own retries are off or told not to).

Only transient failures are retried, at most `retry.attempts` calls in all, waiting as
backoff.py says between them. It stops early, passing the failure on, when the upstream asks
for a longer wait than `retry.retry_after_cap_s`, when the wait would end past the request's
deadline, or when every deployment of the alias is cooling down (circuit open: waiting out a
cooldown is the fallback's job, not the loop's). Streams are retried only before their first
byte reached the client: the loop wraps opening the stream, never relaying it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.control.backoff import Timing, backoff_s, retry_after_s
from proxy.control.classify import classify
from proxy.control.outcome import CircuitOpen
from proxy.exchange import Recovery
from proxy.policies.spec import ErrorClass, RetrySpec
from proxy.upstream.base import UpstreamHTTPError

T = TypeVar("T")
OnRetry = Callable[[ErrorClass, float], None]


def _ignore(kind: ErrorClass, delay: float) -> None:
    return None


async def with_retries(
    attempt: Callable[[int], Awaitable[T]],
    spec: RetrySpec,
    recovery: Recovery,
    timing: Timing,
    *,
    attempts: int | None = None,
    on_retry: OnRetry = _ignore,
) -> T:
    """`attempt(number)` until it returns, a failure that is not worth retrying, or the last
    attempt (`attempts`, default `spec.attempts`). Each retry is appended to
    `recovery.steps`; `on_retry(class, delay)` is told before its wait."""
    total = spec.attempts if attempts is None else attempts
    for number in range(1, total + 1):
        try:
            return await attempt(number)
        except Exception as error:
            kind = classify(error, spec.classify)
            if kind is not None:
                recovery.last_class = kind
            delay = _delay(error, kind, number, total, spec, recovery, timing)
            if kind is None or delay is None:
                raise
            recovery.steps.append("retry")
            on_retry(kind, delay)
            await timing.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _delay(
    error: Exception,
    kind: ErrorClass | None,
    number: int,
    total: int,
    spec: RetrySpec,
    recovery: Recovery,
    timing: Timing,
) -> float | None:
    """The wait before the next attempt, or None to stop (saying why in recovery.guidance)."""
    recovery.guidance = None
    if kind != "transient" or isinstance(error, CircuitOpen):
        return None
    if number >= total:
        if total > 1:
            recovery.guidance = (
                f"all {total} attempts failed; raise retry.attempts or add a fallback"
            )
        return None
    hint = None
    if isinstance(error, UpstreamHTTPError):
        hint = retry_after_s(error.headers, timing.wall)
    if hint is not None and hint > spec.retry_after_cap_s:
        recovery.guidance = (
            f"the upstream asked to wait {hint:g}s, longer than retry.retry_after_cap_s "
            f"({spec.retry_after_cap_s:g}s), so the proxy did not retry; retry after its "
            "Retry-After"
        )
        return None
    delay = hint if hint is not None else backoff_s(spec, number - 1, timing.jitter)
    if recovery.deadline is not None and timing.clock() + delay >= recovery.deadline:
        recovery.guidance = (
            "the next retry would end past the request's deadline; raise retry.deadline_s "
            "to allow more time"
        )
        return None
    return delay
