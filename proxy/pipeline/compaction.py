"""Fit the history to the target model's context window.

Proactive: when the estimate (messages + tool schemas, with room kept for the answer) passes
`trigger` of the window, in order and stopping as soon as it fits:
  0. reuse the longest checkpoint whose prefix matches (byte for byte, no summarizer call);
  a. truncate long string arguments of old writing-tool calls (fit_truncate.py);
  b. archive the older part, then replace it with a structured summary and checkpoint that;
  d. if the summarizer fails or is too slow, cut the middle out instead (with a marker).
Reactive (overflow.py): the same steps to a tighter target once the provider said it
overflowed, and that session keeps the tighter trigger from then on.

Stability: every output is head + replacement + messages[cut:], where the replacement comes
from a checkpoint and old arguments truncate deterministically up to a stored horizon, so
between compaction events appending to the input appends to the output.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cachetools import LRUCache

from proxy.exchange import Exchange
from proxy.messages import Message, prefix_hashes
from proxy.pipeline.base import StageContext, record
from proxy.pipeline.fit_budget import (
    Budget,
    budget_for,
    choose_cut,
    head_length,
    recent_start,
    reserved_output,
    schema_tokens,
    tokens_of,
)
from proxy.pipeline.fit_checkpoints import Checkpoint, CheckpointIndex, Mark, SessionState, key_of
from proxy.pipeline.fit_summarize import archive, middle_out, summary_message
from proxy.pipeline.fit_truncate import Truncator
from proxy.policies.spec import Policy

log = logging.getLogger("agentproxy.compaction")

STAGE = "compaction"


@dataclass(slots=True)
class _Plan:
    """The output under construction: head + inserted + tail, tail = messages[base:]."""

    head: list[Message]
    inserted: list[Message]
    base: int
    tail: list[Message]
    fixed: int  # tool schema tokens
    changed: bool = False

    def tokens(self) -> int:
        return self.fixed + tokens_of(self.head) + tokens_of(self.inserted) + tokens_of(self.tail)

    def output(self) -> list[Message] | None:
        return [*self.head, *self.inserted, *self.tail] if self.changed else None


class CompactionStage:
    name = STAGE

    def __init__(self, sessions: int = 4096) -> None:
        self.index = CheckpointIndex(sessions)
        self.truncator = Truncator()
        # Used by overflow.py: per session, a signature of the last reactive recovery.
        self.recoveries: LRUCache[str, int] = LRUCache(sessions)

    def enabled(self, policy: Policy) -> bool:
        return policy.compaction.enabled

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        budget = budget_for(ex, ctx)
        if budget is None:
            return None
        spec = ex.policy.compaction
        tokens = budget.fixed + tokens_of(messages)
        # No session's trigger is ever below the reactive target: under it, no state is needed.
        floor = min(spec.trigger, spec.reactive_target) if spec.reactive else spec.trigger
        if tokens <= budget.limit(floor):
            return None
        state = await self.index.state(ctx.store, ex.session)
        trigger = min(spec.trigger, state.trigger or spec.trigger)
        if tokens <= budget.limit(trigger):
            return None
        async with state.lock:
            return await self._fit(ex, messages, ctx, budget, budget.limit(trigger), state)

    async def compact_to(
        self, ex: Exchange, messages: list[Message], ctx: StageContext, fraction: float
    ) -> list[Message] | None:
        """Compact to `fraction` of the window whatever the trigger, and keep that as the
        session's trigger (the reactive path: the provider said the context overflowed)."""
        budget = budget_for(ex, ctx)
        if budget is None:  # window unknown: what just overflowed is our best guess at it
            sent = tokens_of(messages) + schema_tokens(ex.body.get("tools"))
            budget = budget_for(ex, ctx, window=sent + reserved_output(ex.body))
        if budget is None:
            return None
        state = await self.index.state(ctx.store, ex.session)
        if state.trigger is None or state.trigger > fraction:
            state.trigger = fraction
            await self._save(ex, ctx, state)
        async with state.lock:
            return await self._fit(ex, messages, ctx, budget, budget.limit(fraction), state)

    async def _fit(
        self,
        ex: Exchange,
        messages: Sequence[Message],
        ctx: StageContext,
        budget: Budget,
        target: int,
        state: SessionState,
    ) -> list[Message] | None:
        head = head_length(messages)
        plan = _Plan(list(messages[:head]), [], head, list(messages[head:]), budget.fixed)
        hashes = prefix_hashes(messages[: state.needed_length()])
        await self._reuse_checkpoint(ex, ctx, messages, state, plan, hashes)
        truncation = state.truncation
        horizon = truncation.length if truncation and truncation.holds(hashes) else 0
        spec = ex.policy.compaction
        keep_tokens = int(spec.keep_recent * budget.window)
        recent = recent_start(messages, plan.base, keep_tokens, spec.keep_messages)
        if horizon > plan.base or plan.tokens() > target:
            await self._truncate(ex, ctx, messages, state, plan, horizon, recent, target)
        if plan.tokens() > target:
            await self._summarize(ex, ctx, messages, state, plan, recent, budget.window)
        return plan.output()

    async def _reuse_checkpoint(
        self,
        ex: Exchange,
        ctx: StageContext,
        messages: Sequence[Message],
        state: SessionState,
        plan: _Plan,
        hashes: list[int],
    ) -> None:
        mark = state.longest_checkpoint(hashes)
        if mark is None or mark.length >= len(messages) or mark.length < plan.base:
            return
        checkpoint = await self.index.body(ctx.store, ex.session, mark)
        if checkpoint is None:
            return
        before = plan.tokens()
        plan.inserted = checkpoint.fresh_messages()
        plan.tail = plan.tail[mark.length - plan.base :]
        plan.base, plan.changed = mark.length, True
        record(
            ex, ctx, STAGE, "checkpoint_reused", tokens_before=before,
            tokens_after=plan.tokens(), messages=mark.length, ref=checkpoint.ref,
        )  # fmt: skip

    async def _truncate(
        self,
        ex: Exchange,
        ctx: StageContext,
        messages: Sequence[Message],
        state: SessionState,
        plan: _Plan,
        horizon: int,
        recent: int,
        target: int,
    ) -> None:
        """Re-apply the stored horizon (same bytes as last turn); move it up to the recent
        part only when still over the target (a compaction event)."""
        before = plan.tokens()
        stop = horizon
        done = await self.truncator.apply(ex, ctx.store, messages, plan.base, stop)
        old_count = done.arguments
        if before - _saved(plan, done.messages) > target and recent > max(horizon, plan.base):
            stop = recent
            done = await self.truncator.apply(ex, ctx.store, messages, plan.base, stop)
        if done.failed:
            record(ex, ctx, STAGE, "store_failed", arguments=done.failed)
        if not done.arguments:
            return
        plan.tail = done.messages + list(messages[max(stop, plan.base) :])
        plan.changed = True
        if stop > horizon and done.arguments > old_count:
            state.truncation = Mark(stop, key_of(prefix_hashes(messages[:stop])[-1]))
            await self._save(ex, ctx, state)
        record(
            ex, ctx, STAGE, "truncated_arguments", tokens_before=before,
            tokens_after=plan.tokens(), arguments=done.arguments, new=done.stored,
        )  # fmt: skip

    async def _summarize(
        self,
        ex: Exchange,
        ctx: StageContext,
        messages: Sequence[Message],
        state: SessionState,
        plan: _Plan,
        recent: int,
        window: int,
    ) -> None:
        cut = choose_cut(messages, plan.base, recent)
        if cut is None:
            return  # nothing old enough to summarize without splitting a tool call
        before = plan.tokens()
        stretch = [*plan.inserted, *messages[plan.base : cut]]
        try:  # archive first: nothing leaves the context unless it is stored
            ref = await archive(ex, ctx.store, stretch, plan.base, cut - 1)
        except Exception as exc:
            log.warning("archive failed for session %s: %s", ex.session, exc)
            record(ex, ctx, STAGE, "store_failed", error=f"{type(exc).__name__}: {exc}")
            return
        started = time.perf_counter()
        replacement, kind = await self._replacement(ex, ctx, plan.inserted, stretch, ref, window)
        seconds = _since(started)
        checkpoint = Checkpoint(
            Mark(cut, key_of(prefix_hashes(messages[:cut])[-1])), kind, tuple(replacement), ref
        )
        try:
            await self.index.add(ctx.store, ex.session, state, checkpoint)
        except Exception as exc:  # this turn still fits; the next one recomputes
            record(ex, ctx, STAGE, "store_failed", error=f"{type(exc).__name__}: {exc}")
        plan.inserted = checkpoint.fresh_messages()
        plan.tail = plan.tail[cut - plan.base :]
        plan.base, plan.changed = cut, True
        action = "summarized" if kind == "summary" else "middle_out"
        record(
            ex, ctx, STAGE, action, tokens_before=before, tokens_after=plan.tokens(),
            messages=len(stretch), ref=ref, summarizer_seconds=seconds,
        )  # fmt: skip

    async def _replacement(
        self,
        ex: Exchange,
        ctx: StageContext,
        previous: list[Message],
        stretch: list[Message],
        ref: str,
        window: int,
    ) -> tuple[list[Message], str]:
        spec = ex.policy.compaction
        recall = ex.policy.recall.enabled
        started = time.perf_counter()  # for the failure note: how long we waited
        try:
            summary = await asyncio.wait_for(ctx.summarize(ex, stretch), spec.summarizer_timeout_s)
            if not summary.strip():
                raise ValueError("the summarizer returned an empty summary")
        except Exception as exc:  # never fail the request because compaction failed
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            record(ex, ctx, STAGE, "summarizer_failed", error=error, seconds=_since(started))
            return middle_out(previous, stretch, ref, recall), "middle_out"
        return [summary_message(summary, len(stretch), ref, window, recall)], "summary"

    async def _save(self, ex: Exchange, ctx: StageContext, state: SessionState) -> None:
        try:
            await self.index.save(ctx.store, ex.session, state)
        except Exception as exc:
            record(ex, ctx, STAGE, "store_failed", error=f"{type(exc).__name__}: {exc}")


def _saved(plan: _Plan, truncated: list[Message]) -> int:
    """Tokens the truncated slice saves against the same slice of the current tail."""
    return tokens_of(plan.tail[: len(truncated)]) - tokens_of(truncated)


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)
