"""Budgets: circuit breakers for spend.

Before a call the guard refuses a request whose scope is already over a limit, or would be
with this request's estimated prompt plus its max_tokens (or, when the budget names a cheaper
alias in `on_exhausted`, has control serve it there: proxy/control/downgrade.py); past the
soft limit it warns (and can ask the model to wrap up). After the call the real usage is
charged. Spend lives in the state store per (budget, scope, window); a subagent's spend also
counts against its parent session. Windows are fixed: a minute, hour or day on the epoch's
grid, a calendar month in UTC (from 00:00 on the 1st).
"""

from __future__ import annotations

import calendar
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.control.downgrade import Downgrade
from proxy.control.fallback import may_serve
from proxy.errors import ProxyError
from proxy.exchange import Exchange, Usage
from proxy.logs.limit import warn_limited
from proxy.messages import Message
from proxy.pipeline.base import StageContext, record
from proxy.policies.spec import BudgetSpec, Policy
from proxy.sessions.identity import name_in_scope
from proxy.store.base import StoreError

log = logging.getLogger("agentproxy.pipeline")
SPACE = "budget"

WINDOW_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}
DAY = 86400.0
WRAP_UP = (
    "[agentproxy] Budget '{name}' has used {pct}% of its {limit} limit. Wrap up: finish the "
    "current step, then summarize what is done and what is left."
)


class BudgetExceeded(ProxyError):
    status = 429
    type = "budget_exceeded"
    code = "budget_exceeded"

    def __init__(self, message: str, details: dict[str, Any], headers: dict[str, str]) -> None:
        super().__init__(message, headers=headers)
        self.details = details

    def body(self, request_id: str | None) -> dict[str, object]:
        body = super().body(request_id)
        error = body["error"]
        assert isinstance(error, dict)
        error["budget"] = self.details
        return body


@dataclass(slots=True)
class Spend:
    first_at: float
    prompt_tokens: float = 0
    completion_tokens: float = 0
    cost_usd: float = 0.0
    calls: float = 0

    @classmethod
    def of(cls, counters: dict[str, float], now: float) -> Spend:
        return cls(
            first_at=counters.get("first_at", now),
            prompt_tokens=counters.get("prompt_tokens", 0),
            completion_tokens=counters.get("completion_tokens", 0),
            cost_usd=counters.get("cost_usd", 0.0),
            calls=counters.get("calls", 0),
        )

    def value(self, limit: str, now: float) -> float:
        if limit == "tokens":
            return self.prompt_tokens + self.completion_tokens
        if limit == "wall_s":
            return now - self.first_at
        return float(getattr(self, limit))


class BudgetUnavailable(ProxyError):
    status = 503
    type = "budget_unavailable"
    code = "budget_unavailable"


class BudgetStage:
    """The guard (a chain stage, run last so it sees the compacted request) and the ledger.
    Spend lives in the state store (ctx.state): in memory, or in Redis shared by replicas,
    one counter set per (budget, scope, window), added to atomically."""

    name = "budget"
    guard = True  # runs on every request, its history seen whole or not
    preserves_pairing = True  # it only ever appends a user note

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # wall time: windows follow the calendar
        # Per (budget, limit): the window start and the highest fraction used in it.
        self._highest: dict[tuple[str, str], tuple[float, float]] = {}

    def enabled(self, policy: Policy) -> bool:
        return bool(policy.budgets)

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        now = self.clock()
        prompt = ex.estimated_prompt()
        completion = ex.body.get("max_completion_tokens") or ex.body.get("max_tokens") or 0
        notes: list[Message] = []
        for spec in ex.policy.budgets:
            for scope_id in self._scope_ids(ex, spec):
                spend = await self._spend(ex, ctx, spec, scope_id, now)
                if spend is None:
                    continue
                for limit, cap in spec.limits.items():
                    used = spend.value(limit, now)
                    ahead = _ahead(limit, prompt, completion)
                    if used + ahead > cap:
                        refusal = self._refusal(spec, scope_id, limit, cap, used, ahead, now)
                        self._exhausted(ex, ctx, spec, limit, refusal)
                    if used >= spec.soft * cap:
                        pct = int(100 * used / cap)
                        record(ex, ctx, self.name, "soft_limit", budget=spec.name, limit=limit,
                               percent=pct)  # fmt: skip
                        if spec.wrap_up:
                            text = WRAP_UP.format(name=spec.name, pct=pct, limit=limit)
                            notes.append({"role": "user", "content": text})
        if not notes:
            return None
        return [*messages, notes[0]]  # one note is enough, however many limits are near

    async def allows(self, ex: Exchange, ctx: StageContext, prompt: int, completion: int) -> bool:
        """Whether a call of the proxy's own for this exchange's scopes (a summary written
        ahead of need), of about `prompt` tokens in and `completion` out, stays within every
        limit; an unreadable spend says no (the call is optional)."""
        now = self.clock()
        for spec in ex.policy.budgets:
            for scope_id in self._scope_ids(ex, spec):
                try:
                    key = self._key(spec, scope_id, now)
                    spend = Spend.of(await ctx.state.counters(SPACE, key), now)
                except StoreError:
                    return False
                for limit, cap in spec.limits.items():
                    ahead = _ahead(limit, prompt, completion) if limit != "calls" else 0
                    if limit == "cost_usd" and spend.value(limit, now) >= cap:
                        return False
                    if spend.value(limit, now) + ahead > cap:
                        return False
        return True

    async def _spend(
        self, ex: Exchange, ctx: StageContext, spec: BudgetSpec, scope_id: str, now: float
    ) -> Spend | None:
        """The scope's spend so far; None when it cannot be read and the policy allows that."""
        try:
            return Spend.of(await ctx.state.counters(SPACE, self._key(spec, scope_id, now)), now)
        except StoreError as exc:
            if spec.on_store_error == "refuse":
                record(ex, ctx, self.name, "refused", budget=spec.name, reason="store_down")
                raise BudgetUnavailable(
                    f"budget '{spec.name}' cannot be checked: its spend is unreadable ({exc}); "
                    "the policy says on_store_error: refuse"
                ) from exc
            record(ex, ctx, self.name, "unchecked", budget=spec.name, error=str(exc))
            return None

    async def after_call(
        self, ex: Exchange, ctx: StageContext, usage: Usage | None, cost: float | None, calls: int
    ) -> None:
        """The after-call hook: what the request used is charged to its budgets."""
        await self.charge(ex, ctx, usage, cost, calls)

    async def charge(
        self,
        ex: Exchange,
        ctx: StageContext,
        usage: Usage | None,
        cost: float | None,
        calls: int,
    ) -> None:
        """After the call: what it really cost, counted once per scope (parent included)."""
        now = self.clock()
        amounts = {"calls": float(calls), "cost_usd": cost or 0.0}
        if usage is not None:
            amounts["prompt_tokens"] = usage.prompt_tokens
            amounts["completion_tokens"] = usage.completion_tokens
        for spec in ex.policy.budgets:
            ttl = _ttl(spec, now)
            for scope_id in self._scope_ids(ex, spec):
                key = self._key(spec, scope_id, now)
                try:
                    counters = await ctx.state.add(
                        SPACE, key, amounts, first={"first_at": now}, ttl_s=ttl
                    )
                except StoreError as exc:
                    what = "budget %s not charged for %s: %s"
                    warn_limited(log, "budget.charge", what, spec.name, ex.identity.request_id, exc)
                    continue
                self._show(ctx, spec, Spend.of(counters, now), now)

    def _show(self, ctx: StageContext, spec: BudgetSpec, spend: Spend, now: float) -> None:
        """The gauges: each limit, and the fullest subject of the current window."""
        metrics = ctx.metrics
        span = window_span(spec.window, now)
        window = span[0] if span is not None else 0.0
        for limit, cap in spec.limits.items():
            metrics.child(metrics.budget_limit, spec.name, limit).set(cap)
            ratio = spend.value(limit, now) / cap if cap else 0.0
            started, highest = self._highest.get((spec.name, limit), (window, 0.0))
            if started != window or ratio > highest:
                self._highest[(spec.name, limit)] = (window, ratio)
                metrics.child(metrics.budget_used_ratio, spec.name, limit).set(ratio)

    def _exhausted(
        self, ex: Exchange, ctx: StageContext, spec: BudgetSpec, limit: str, refusal: BudgetExceeded
    ) -> None:
        """A limit is reached: the request is refused, or, when the budget names a cheaper
        alias, served there (each budget moves a request once; the alias it is on already, or
        one another budget moved it to, passes)."""
        target = spec.on_exhausted
        if target is not None:
            moved = ex.recovery.downgrades
            served = {s.on_exhausted for s in ex.policy.budgets if s.name in moved}
            if ex.alias == target or ex.alias in served:
                return  # the rest of the window, served cheaper: still charged here
            if spec.name not in moved and may_serve(ex, target):
                if not ex.dry_run:
                    raise Downgrade(refusal, target, spec.name, limit)
                record(ex, ctx, self.name, "would_downgrade", budget=spec.name, to=target)
                return
        record(ex, ctx, self.name, "refused", budget=spec.name, limit=limit,
               spent=refusal.details["spent"])  # fmt: skip
        raise refusal

    def _refusal(
        self,
        spec: BudgetSpec,
        scope_id: str,
        limit: str,
        cap: float,
        used: float,
        ahead: float,
        now: float,
    ) -> BudgetExceeded:
        resets = self._resets_at(spec, now)
        details = {
            "name": spec.name,
            "scope": spec.scope,
            "scope_id": _shown(spec, scope_id),
            "limit": limit,
            "value": cap,
            "spent": round(used, 6),
            "this_request": ahead,
            "window": spec.window,
            "resets_at": resets,
        }
        headers = {"x-should-retry": "false"}
        if resets is not None:
            headers["retry-after"] = str(max(1, int(resets - now + 0.999)))
        when = ""
        if resets is not None:
            shown = "%Y-%m-%d %H:%M:%S" if spec.window == "month" else "%H:%M:%S"
            when = f"; it resets at {time.strftime(shown, time.gmtime(resets))} UTC"
        return BudgetExceeded(
            f"budget '{spec.name}' ({spec.scope}, {spec.window}) allows {limit} {cap:g}; "
            f"{used:g} spent and this request may add {ahead:g}{when}",
            details,
            headers,
        )

    @staticmethod
    def _scope_ids(ex: Exchange, spec: BudgetSpec) -> list[str]:
        identity = ex.identity
        if spec.scope == "session":
            parent = identity.parent_session
            return [identity.session, *([parent] if parent else [])]
        key = identity.key
        if spec.scope == "key":
            return [key.name if key else "-"]
        if spec.scope == "team":
            return [key.team or "-" if key else "-"]
        return ["*"]

    @staticmethod
    def _key(spec: BudgetSpec, scope_id: str, now: float) -> str:
        """The counters' key: a month's is tagged, as its start is also a day's (and an
        hour's) start and a budget of the same name may have another window elsewhere."""
        span = window_span(spec.window, now)
        start = int(span[0]) if span is not None else 0
        window = f"month:{start}" if spec.window == "month" else str(start)
        return f"{spec.name}|{spec.scope}|{scope_id}|{window}"

    @staticmethod
    def _resets_at(spec: BudgetSpec, now: float) -> float | None:
        span = window_span(spec.window, now)
        return span[1] if span is not None else None


def window_span(window: str, now: float) -> tuple[float, float] | None:
    """The window holding `now`, as (start, end) epoch seconds; None for lifetime. A month is
    the calendar month in UTC: a fixed number of seconds it is not."""
    seconds = WINDOW_SECONDS.get(window)
    if seconds is not None:
        start = now // seconds * seconds
        return start, start + seconds
    if window != "month":
        return None
    year, month = time.gmtime(now)[:2]
    following = (year + 1, 1) if month == 12 else (year, month + 1)
    start = calendar.timegm((year, month, 1, 0, 0, 0))
    return float(start), float(calendar.timegm((*following, 1, 0, 0, 0)))


def _ttl(spec: BudgetSpec, now: float) -> float | None:
    """How long a charge keeps the counters: a window's outlive its end a little (one window,
    a day at most); lifetime spend of a session goes with the session (store.session_ttl), a
    key's, team's or everyone's is kept, or a quiet week would reset its limit."""
    span = window_span(spec.window, now)
    if span is None:
        return None if spec.scope == "session" else math.inf
    start, end = span
    return end - now + min(end - start, DAY)


def _shown(spec: BudgetSpec, scope_id: str) -> str:
    """A scope as the caller knows it: a session by the name it sent (without its owner)."""
    if spec.scope == "session":
        return name_in_scope(scope_id)
    return "(this key)" if spec.scope == "key" else scope_id


def _ahead(limit: str, prompt: int, completion: int) -> float:
    """What this request may add to a limit before it runs (cost is charged after)."""
    return {
        "tokens": prompt + completion,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "calls": 1,
    }.get(limit, 0)
