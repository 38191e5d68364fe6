"""Rate-limit windows: per subject, a token bucket of requests and one of tokens a minute, and
the requests it has in flight. In process memory here (one process); in Redis, shared by every
replica, in proxy/store/redis_windows.py (the same arithmetic, in one Lua script).

A bucket of `rpm` requests starts full and refills continuously at rpm/60 a second: a burst of
the whole minute's allowance passes at once, then one request every 60/rpm seconds. An
admission takes from every subject's buckets at once or from none (all-or-nothing), so a
refused request costs no subject anything. The tokens bucket may go below zero: a request is
admitted on its estimated input and charged its real usage after (`give_back` returns the
difference, or takes more), and a debt holds later requests back until it is refilled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from proxy.policies.spec import RateLimits

# No better time to tell a client refused for `max_concurrent`: the soonest a slot could free.
CONCURRENCY_RETRY_S = 1.0
SWEEP_EVERY = 1024  # admissions between two sweeps of the idle subjects (memory)
# Subjects held in memory at most (~350 bytes each: ~35 MB): past it, a sweep, then the oldest
# with nothing in flight go first (their windows start again full: a flood of new sessions
# cannot grow the process without bound).
MAX_SUBJECTS = 100_000


class Subject(NamedTuple):
    """One window an admission goes through: its id (scope and name, owner-scoped for a
    session) and the limits it holds to."""

    id: str
    limits: RateLimits


@dataclass(frozen=True, slots=True)
class Refusal:
    index: int  # which subject refused
    limit: str  # rpm, tpm or max_concurrent
    retry_after_s: float  # until that limit lets this request through


class Windows(Protocol):
    backend: str

    async def take(self, subjects: Sequence[Subject], lease: str, tokens: int) -> Refusal | None:
        """Admit one request of about `tokens` input tokens through every subject (a slot
        held under `lease` where max_concurrent is set), or none: then the refusal that frees
        last. May raise StoreError."""
        ...

    async def give_back(self, subjects: Sequence[Subject], lease: str, tokens: float) -> None:
        """The request is over: its slots free, and `tokens` returned to the tokens buckets
        (negative: more taken, what it used past its estimate). Once per admitted lease (the
        guard's Lease says whether it was). May raise StoreError."""
        ...


class _Bucket:
    __slots__ = ("at", "in_flight", "requests", "tokens")

    def __init__(self, now: float, limits: RateLimits) -> None:
        self.at = now
        self.requests = float(limits.rpm or 0)
        self.tokens = float(limits.tpm or 0)
        self.in_flight = 0

    def refill(self, now: float, limits: RateLimits) -> None:
        elapsed = now - self.at
        self.at = now
        rpm, tpm = limits.rpm, limits.tpm
        if rpm:
            requests = self.requests + elapsed * rpm / 60
            self.requests = rpm if requests > rpm else requests
        if tpm:
            tokens = self.tokens + elapsed * tpm / 60
            self.tokens = tpm if tokens > tpm else tokens

    def idle(self, now: float, limits: RateLimits) -> bool:
        """Full again and nothing in flight: as good as absent."""
        self.refill(now, limits)
        return (
            self.in_flight == 0
            and (not limits.rpm or self.requests >= limits.rpm)
            and (not limits.tpm or self.tokens >= limits.tpm)
        )


def refusal(bucket: _Bucket, limits: RateLimits, tokens: int) -> tuple[str, float] | None:
    """The limit this bucket refuses the request for, and how long until it would not."""
    worst: tuple[str, float] | None = None
    if limits.rpm and bucket.requests < 1:
        worst = ("rpm", (1 - bucket.requests) * 60 / limits.rpm)
    if limits.tpm:
        # A request larger than the whole minute passes when the bucket is full (then its debt
        # holds the next ones back), rather than never.
        need = min(tokens, limits.tpm)
        if bucket.tokens < need:
            wait = (need - bucket.tokens) * 60 / limits.tpm
            if worst is None or wait > worst[1]:
                worst = ("tpm", wait)
    full = limits.max_concurrent and bucket.in_flight >= limits.max_concurrent
    if full and (worst is None or worst[1] < CONCURRENCY_RETRY_S):
        worst = ("max_concurrent", CONCURRENCY_RETRY_S)
    return worst


class MemoryWindows:
    """One process's windows. Bounded by activity: a subject whose buckets are full again and
    that has nothing in flight is dropped at the next sweep; and by count (MAX_SUBJECTS)."""

    backend = "memory"

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_subjects: int = MAX_SUBJECTS
    ) -> None:
        self._clock = clock
        self.max_subjects = max_subjects
        self._buckets: dict[str, tuple[_Bucket, RateLimits]] = {}
        self._until_sweep = SWEEP_EVERY

    def __len__(self) -> int:
        return len(self._buckets)

    async def take(self, subjects: Sequence[Subject], lease: str, tokens: int) -> Refusal | None:
        return self.take_now(subjects, tokens)

    async def give_back(self, subjects: Sequence[Subject], lease: str, tokens: float) -> None:
        self.give_back_now(subjects, tokens)

    def take_now(self, subjects: Sequence[Subject], tokens: int) -> Refusal | None:
        # Every request with limits runs this: the refill and the checks are written out
        # inline (a call per bucket cost more than the arithmetic).
        now = self._clock()
        buckets = self._buckets
        held: list[_Bucket] = []
        short = False
        for subject, limits in subjects:
            found = buckets.get(subject)
            if found is None:
                bucket = _Bucket(now, limits)
                buckets[subject] = (bucket, limits)
                if len(buckets) > self.max_subjects:
                    self._until_sweep = 0  # swept below, once this admission is done
            else:
                bucket = found[0]
                if found[1] is not limits:  # a reload changed them: the new ones hold
                    buckets[subject] = (bucket, limits)
                bucket.refill(now, limits)
            rpm, tpm, most = limits.rpm, limits.tpm, limits.max_concurrent
            if (
                (rpm and bucket.requests < 1)
                or (tpm and bucket.tokens < (tokens if tokens < tpm else tpm))
                or (most and bucket.in_flight >= most)
            ):
                short = True
            held.append(bucket)
        refused = self._refusal(held, subjects, tokens) if short else None
        if refused is None:
            for bucket, (_, limits) in zip(held, subjects, strict=True):
                if limits.rpm:
                    bucket.requests -= 1
                if limits.tpm:
                    bucket.tokens -= tokens
                if limits.max_concurrent:
                    bucket.in_flight += 1
        self._until_sweep -= 1
        if self._until_sweep <= 0:  # after the taking: what was just taken from stays
            self._sweep(now)
        return refused

    @staticmethod
    def _refusal(held: list[_Bucket], subjects: Sequence[Subject], tokens: int) -> Refusal | None:
        """The refusal that frees last, of the buckets found short."""
        refused: Refusal | None = None
        for index, (bucket, (_, limits)) in enumerate(zip(held, subjects, strict=True)):
            why = refusal(bucket, limits, tokens)
            if why is not None and (refused is None or why[1] > refused.retry_after_s):
                refused = Refusal(index, *why)
        return refused

    def give_back_now(self, subjects: Sequence[Subject], tokens: float) -> None:
        now = self._clock()
        buckets = self._buckets
        for subject, limits in subjects:
            found = buckets.get(subject)
            if found is None:  # swept while full: only a debt matters now
                if not (limits.tpm and tokens < 0):
                    continue
                found = buckets[subject] = (_Bucket(now, limits), limits)
            bucket = found[0]
            if limits.max_concurrent and bucket.in_flight > 0:
                bucket.in_flight -= 1
            tpm = limits.tpm
            if tpm and tokens:
                bucket.refill(now, limits)
                left = bucket.tokens + tokens
                bucket.tokens = tpm if left > tpm else left

    def _sweep(self, now: float) -> None:
        self._until_sweep = SWEEP_EVERY
        buckets = self._buckets
        idle = [s for s, (bucket, limits) in buckets.items() if bucket.idle(now, limits)]
        for subject in idle:
            del buckets[subject]
        over = len(buckets) - int(self.max_subjects * 0.9)
        if over > 0:  # still too many: the oldest with nothing in flight
            oldest = [s for s, (bucket, _) in buckets.items() if not bucket.in_flight][:over]
            for subject in oldest:
                del buckets[subject]
