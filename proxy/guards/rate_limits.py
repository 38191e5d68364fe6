"""Rate limits: requests a minute, tokens a minute and requests at once, per key, team,
session or everyone a policy serves (proxy/policies/spec.py: RateLimits, PolicyLimits).

Checked at admission, before any rewrite or upstream call: a request past a limit is refused
with 429 rate_limited and `Retry-After` (seconds until the limit lets it through), in the
client's wire format. Every subject it concerns is charged at once or none is
(proxy/store/windows.py); the windows are in process memory with the local store, and in
Redis, shared by every replica, with the redis one.

Tokens: admission charges the request's estimated input tokens (the body's size over four:
O(1), known before any work) and requires that much room; when the request is over, the
difference to what it really used (prompt plus completion tokens, as the provider reported)
is given back or taken. A request that reached no upstream gives its estimate back.

The slot a request holds for `max_concurrent` is given back when it is over, whatever the
path: answered, refused later (a budget), failed, its stream ended or its client gone.

A subject's window is its own: each key's, each team's (a key without a team is a team of its
own), each session's scoped by its owner (another key sending the same session id has another
window), the policy's global one. A policy's blocks are per policy: two policies keep apart.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

from proxy.errors import ProxyError
from proxy.exchange import Exchange
from proxy.logs.limit import warn_limited
from proxy.metrics import Metrics
from proxy.policies.spec import LimitScope, RateLimits
from proxy.recording.recorder import Recorder
from proxy.sessions.identity import name_in_scope
from proxy.store.base import StoreError
from proxy.store.windows import MemoryWindows, Refusal, Subject, Windows

log = logging.getLogger("agentproxy.guards")
STAGE = "rate_limit"


class RateLimited(ProxyError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limited"
    unsent = True


class RateLimitUnavailable(ProxyError):
    status = 503
    type = "rate_limit_unavailable"
    code = "rate_limit_unavailable"
    unsent = True


@dataclass(slots=True)
class Lease:
    """What one admitted request holds until it is over."""

    subjects: list[Subject]
    scopes: list[LimitScope]
    id: str  # "" in process memory, where no lease is named
    tokens: int  # charged at admission
    counts_tokens: bool  # some subject has a tpm
    holds_slots: bool  # some subject has a max_concurrent
    released: bool = False


class RateLimiter:
    def __init__(self, windows: Windows, metrics: Metrics, recorder: Recorder) -> None:
        self.windows = windows
        # In process memory the windows never wait: taken without a coroutine of their own.
        self._local = windows if isinstance(windows, MemoryWindows) else None
        self.metrics = metrics
        self.recorder = recorder
        # Lease ids unique across replicas and restarts, whatever request ids clients send.
        self._prefix = os.urandom(6).hex()
        self._serial = itertools.count()
        self._giving_back: set[asyncio.Future[None]] = set()
        for scope in ("session", "key", "team", "global"):
            for limit in ("rpm", "tpm", "max_concurrent"):
                metrics.child(metrics.rate_limited, scope, limit)

    async def admit(self, ex: Exchange) -> Lease | None:
        """The request's lease, or None when no limit concerns it; raises RateLimited past a
        limit (or RateLimitUnavailable when the store is down and a limit says refuse)."""
        key = ex.identity.key
        own = key.limits if key is not None else None
        scopes = ex.policy.limits.scopes
        if own is None and not scopes:
            return None  # the common case: one attribute read each
        lease = self._lease(ex, own, scopes)
        local = self._local
        if local is not None:
            refused = local.take_now(lease.subjects, lease.tokens)
        else:
            lease.id = f"{self._prefix}{next(self._serial)}"
            try:
                refused = await self._take(ex, lease)
            except StoreError as exc:
                self._unchecked(ex, lease, exc)
                return None
        if refused is not None:
            self._refuse(ex, lease, refused)
        return lease

    async def _take(self, ex: Exchange, lease: Lease) -> Refusal | None:
        """The shared store's admission, run to its end even when the client leaves while it
        is on its way: what it took is then given back at once, rather than held until the
        lease expires (a key with max_concurrent: 1 locked for minutes by one hang-up)."""
        taking = asyncio.ensure_future(self.windows.take(lease.subjects, lease.id, lease.tokens))
        try:
            return await asyncio.shield(taking)
        except asyncio.CancelledError:
            taking.add_done_callback(lambda done: self._taken_for_nobody(ex, lease, done))
            raise

    def _taken_for_nobody(self, ex: Exchange, lease: Lease, done: asyncio.Future[Any]) -> None:
        if done.cancelled() or done.exception() is not None or done.result() is not None:
            return  # nothing was taken
        giving = asyncio.ensure_future(self.release(ex, lease))
        self._giving_back.add(giving)  # held until done: a task nobody holds may be collected
        giving.add_done_callback(self._giving_back.discard)

    async def release(self, ex: Exchange, lease: Lease) -> None:
        """The request is over: free its slots, correct its tokens to what it used."""
        if lease.released:
            return
        lease.released = True
        back = 0.0
        if lease.counts_tokens:
            used = _used(ex)
            if used is not None:
                back = lease.tokens - used
            elif ex.recovery.calls == 0:
                back = lease.tokens  # no upstream call: nothing used
        if back == 0 and not lease.holds_slots:
            return
        local = self._local
        if local is not None:
            local.give_back_now(lease.subjects, back)
            return
        try:
            await self.windows.give_back(lease.subjects, lease.id, back)
        except StoreError as exc:
            what = "rate limit slots of %s not given back: %s (they expire on their own)"
            warn_limited(log, "rate_limit.release", what, ex.identity.request_id, exc)

    def _lease(
        self,
        ex: Exchange,
        own: RateLimits | None,
        scopes: tuple[tuple[LimitScope, RateLimits], ...],
    ) -> Lease:
        subjects, kinds = self._subjects(ex, own, scopes)
        tokens = any(s.limits.tpm for s in subjects)
        slots = any(s.limits.max_concurrent for s in subjects)
        # The input tokens as admission estimates them: before any rewrite, O(1).
        return Lease(subjects, kinds, "", ex.estimated_prompt(), tokens, slots)

    def _subjects(
        self,
        ex: Exchange,
        own: RateLimits | None,
        scopes: tuple[tuple[LimitScope, RateLimits], ...],
    ) -> tuple[list[Subject], list[LimitScope]]:
        identity = ex.identity
        key = identity.key
        name = key.name if key is not None else "-"
        subjects: list[Subject] = []
        kinds: list[LimitScope] = []
        if own is not None:
            subjects.append(Subject(f"own|{name}", own))
            kinds.append("key")
        policy = ex.policy.name
        for scope, limits in scopes:
            if scope == "session":
                who = identity.session  # "<owner>/<name>": another owner's is another window
            elif scope == "key":
                who = name
            elif scope == "team":
                who = f"team:{key.team}" if key is not None and key.team else f"key:{name}"
            else:
                who = "*"
            subjects.append(Subject(f"{policy}|{scope}|{who}", limits))
            kinds.append(scope)
        return subjects, kinds

    def _refuse(self, ex: Exchange, lease: Lease, refused: Refusal) -> None:
        scope = lease.scopes[refused.index]
        limits = lease.subjects[refused.index].limits
        value = getattr(limits, refused.limit)
        wait = max(1, math.ceil(refused.retry_after_s))
        metrics = self.metrics
        metrics.child(metrics.rate_limited, scope, refused.limit).inc()
        self.recorder.record(ex, STAGE, "refused", scope=scope, limit=refused.limit, value=value,
                             retry_after_s=wait)  # fmt: skip
        whose = _whose(ex, scope, lease.subjects[refused.index].id)
        error = RateLimited(
            f"rate limit reached: {refused.limit} {value} for {whose}; retry after {wait} s",
            headers={"retry-after": str(wait)},
        )
        error.extra["rate_limit"] = _details(scope, refused.limit, value, wait, ex)
        raise error

    def _unchecked(self, ex: Exchange, lease: Lease, exc: StoreError) -> None:
        """The store did not answer: each limit says whether that refuses (fail closed) or
        lets the request through unchecked (fail open, the default)."""
        closed = [
            i for i, (_, limits) in enumerate(lease.subjects) if limits.on_store_error == "refuse"
        ]
        if closed:
            scope = lease.scopes[closed[0]]
            self.recorder.record(ex, STAGE, "refused", scope=scope, reason="store_down")
            raise RateLimitUnavailable(
                f"{scope} rate limits cannot be checked: the store does not answer ({exc}); "
                "the limits say on_store_error: refuse",
                headers={"retry-after": "1"},
            ) from exc
        self.recorder.record(ex, STAGE, "unchecked", error=str(exc))


def _used(ex: Exchange) -> int | None:
    """Tokens the request used, its summaries' included; None when no usage is known."""
    total: int | None = None
    usages = [ex.accounting.usage, *(side.usage for side in ex.accounting.side_calls)]
    for usage in usages:
        if usage is not None:
            total = (total or 0) + usage.prompt_tokens + usage.completion_tokens
    return total


def _whose(ex: Exchange, scope: LimitScope, subject: str) -> str:
    if scope == "session":
        return f"session {name_in_scope(ex.identity.session)!r}"
    if scope == "global":
        return f"policy {ex.policy.name!r} (all its clients)"
    if subject.startswith("own|"):
        return "this key"
    return "this key" if scope == "key" else "this key's team"


def _details(scope: str, limit: str, value: Any, wait: int, ex: Exchange) -> dict[str, Any]:
    return {"scope": scope, "limit": limit, "value": value, "retry_after_s": wait,
            "policy": ex.policy.name}  # fmt: skip
