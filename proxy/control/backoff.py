"""How long to wait before the next attempt.

Without a hint: exponential backoff with full jitter, uniform(0, min(cap_s, base_s * factor**n))
before the n-th retry (n from 0). With a hint from the upstream (`retry-after-ms`, else
`Retry-After` in seconds or as an HTTP date): exactly that, when it is at most
`retry_after_cap_s`; a longer hint means no retry at all: the error goes on to the client with
its Retry-After.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

from proxy.policies.spec import RetrySpec


def full_jitter(top: float) -> float:
    return random.uniform(0.0, top)


@dataclass(frozen=True, slots=True)
class Timing:
    """The clocks and the dice control uses; tests inject fakes for fast, exact runs."""

    clock: Callable[[], float] = time.monotonic  # deadlines, cooldowns
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    jitter: Callable[[float], float] = full_jitter  # a ceiling in, the wait out
    wall: Callable[[], float] = time.time  # for Retry-After given as an HTTP date


def backoff_s(spec: RetrySpec, retry: int, jitter: Callable[[float], float]) -> float:
    """The wait before retry number `retry` (0 = the first retry) when the upstream gave no hint."""
    try:
        ceiling = min(spec.cap_s, spec.base_s * spec.factor**retry)
    except OverflowError:
        ceiling = spec.cap_s
    return jitter(ceiling)


def retry_after_s(
    headers: Mapping[str, str], wall: Callable[[], float] = time.time
) -> float | None:
    """The upstream's hint in seconds, or None: `retry-after-ms` (OpenAI's, more precise) first,
    then `Retry-After` as delta-seconds or an HTTP date."""
    ms = seconds = None
    for name, value in headers.items():
        lower = name.lower()
        if lower == "retry-after-ms":
            ms = value
        elif lower == "retry-after":
            seconds = value
    if ms is not None and (parsed := _number(ms)) is not None:
        return parsed / 1000
    if seconds is None:
        return None
    if (parsed := _number(seconds)) is not None:
        return parsed
    try:
        when = parsedate_to_datetime(seconds.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": still GMT, as every HTTP date is
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - wall())


def _number(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
