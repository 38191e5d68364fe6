"""Budgets: circuit breakers for spend.

Before a call the guard refuses a request whose scope is already over a limit, or would be
with this request's estimated prompt plus its max_tokens; past the soft limit it warns (and can
ask the model to wrap up). After the call the real usage is charged. Spend lives in memory per
(budget, scope, window); a subagent's spend also counts against its parent session.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from proxy.errors import ProxyError
from proxy.exchange import Exchange, Usage
from proxy.messages import Message
from proxy.pipeline.base import StageContext, record
from proxy.policies.spec import BudgetSpec, Policy

WINDOW_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}
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
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    calls: int = 0

    def value(self, limit: str, now: float) -> float:
        if limit == "tokens":
            return self.prompt_tokens + self.completion_tokens
        if limit == "wall_s":
            return now - self.first_at
        return float(getattr(self, limit))


class BudgetStage:
    """The guard (a chain stage, run last so it sees the compacted request) and the ledger."""

    name = "budget"
    preserves_pairing = True  # it only ever appends a user note

    def __init__(self, entries: int = 200_000) -> None:
        self._spend: LRUCache[tuple[str, str, str, int], Spend] = LRUCache(entries)

    def enabled(self, policy: Policy) -> bool:
        return bool(policy.budgets)

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        now = time.time()
        prompt = self._estimated_prompt(ex)
        completion = ex.body.get("max_completion_tokens") or ex.body.get("max_tokens") or 0
        notes: list[Message] = []
        for spec in ex.policy.budgets:
            for scope_id in self._scope_ids(ex, spec):
                spend = self._spend.get(self._key(spec, scope_id, now)) or Spend(first_at=now)
                for limit, cap in spec.limits.items():
                    used = spend.value(limit, now)
                    ahead = _ahead(limit, prompt, completion)
                    if used + ahead > cap:
                        self._refuse(ex, ctx, spec, scope_id, limit, cap, used, ahead, now)
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

    def charge(self, ex: Exchange, usage: Usage | None, cost: float | None, calls: int) -> None:
        """After the call: what it really cost, counted once per scope (parent included)."""
        now = time.time()
        for spec in ex.policy.budgets:
            for scope_id in self._scope_ids(ex, spec):
                key = self._key(spec, scope_id, now)
                spend = self._spend.get(key) or Spend(first_at=now)
                if usage is not None:
                    spend.prompt_tokens += usage.prompt_tokens
                    spend.completion_tokens += usage.completion_tokens
                spend.cost_usd += cost or 0.0
                spend.calls += calls
                self._spend[key] = spend

    def _refuse(
        self,
        ex: Exchange,
        ctx: StageContext,
        spec: BudgetSpec,
        scope_id: str,
        limit: str,
        cap: float,
        used: float,
        ahead: float,
        now: float,
    ) -> None:
        resets = self._resets_at(spec, now)
        details = {
            "name": spec.name,
            "scope": spec.scope,
            "scope_id": scope_id if spec.scope != "key" else "(this key)",
            "limit": limit,
            "value": cap,
            "spent": round(used, 6),
            "this_request": ahead,
            "window": spec.window,
            "resets_at": resets,
        }
        record(ex, ctx, self.name, "refused", budget=spec.name, limit=limit, spent=used)
        headers = {"x-should-retry": "false"}
        if resets is not None:
            headers["retry-after"] = str(max(1, int(resets - now + 0.999)))
        when = ""
        if resets is not None:
            when = f"; it resets at {time.strftime('%H:%M:%S', time.gmtime(resets))} UTC"
        raise BudgetExceeded(
            f"budget '{spec.name}' ({spec.scope}, {spec.window}) allows {limit} {cap:g}; "
            f"{used:g} spent and this request may add {ahead:g}{when}",
            details,
            headers,
        )

    @staticmethod
    def _estimated_prompt(ex: Exchange) -> int:
        """The body's size over four: O(1), and on the high side, as a guard should be."""
        estimate = ex.body_bytes // 4
        window = ex.deployment.max_input_tokens if ex.deployment else None
        return min(estimate, window) if window else estimate

    @staticmethod
    def _scope_ids(ex: Exchange, spec: BudgetSpec) -> list[str]:
        if spec.scope == "session":
            return [ex.session, *([ex.parent_session] if ex.parent_session else [])]
        if spec.scope == "key":
            return [ex.key.name if ex.key else "-"]
        if spec.scope == "team":
            return [ex.key.team or "-" if ex.key else "-"]
        return ["*"]

    @staticmethod
    def _key(spec: BudgetSpec, scope_id: str, now: float) -> tuple[str, str, str, int]:
        seconds = WINDOW_SECONDS.get(spec.window)
        start = int(now // seconds * seconds) if seconds else 0
        return (spec.name, spec.scope, scope_id, start)

    @staticmethod
    def _resets_at(spec: BudgetSpec, now: float) -> float | None:
        seconds = WINDOW_SECONDS.get(spec.window)
        return (now // seconds + 1) * seconds if seconds else None


def _ahead(limit: str, prompt: int, completion: int) -> float:
    """What this request may add to a limit before it runs (cost is charged after)."""
    return {
        "tokens": prompt + completion,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "calls": 1,
    }.get(limit, 0)
