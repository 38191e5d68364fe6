"""Fit the history to the target model's context window.

Proactive: when the estimate (messages + tool schemas, with room kept for the answer) passes
`trigger` of the window, in order and stopping as soon as it is back under the trigger:
  0. reuse the longest checkpoint whose prefix matches (byte for byte, no summarizer call);
  a. truncate long string arguments of old writing-tool calls (truncate.py);
  b. archive the older part, then replace it with the session's intent (intent.py) and a
     structured summary, and checkpoint that;
  d. if the summarizer fails, is too slow or answers without the required sections, cut the
     middle out instead (the intent and a marker).
A compaction event (a, b, d) compacts to `target`, well under the trigger, so the next event is
several turns away rather than on the very next turn.
Reactive (overflow.py): the same steps to a tighter target once the provider said it
overflowed; from then on the session's window counts as no larger than what overflowed, but
never smaller than a prompt the model took in this session (what it really takes).

Stability: every output is head + replacement + messages[cut:], where the replacement comes
from a checkpoint and old arguments truncate deterministically up to a stored horizon, so
between compaction events appending to the input appends to the output.

Cost: a warm turn estimates and hashes only the new messages (memo.py); a turn under
the trigger costs that estimate and nothing else.
"""

from __future__ import annotations

import time
from typing import Any

from cachetools import LRUCache

from proxy.exchange import Exchange
from proxy.pipeline.base import StageContext, forget_sessions, record, reusable
from proxy.pipeline.compaction.budget import (
    Budget,
    budget_for,
    choose_cut,
    head_length,
    recent_start,
    reserved_output,
    schema_tokens,
    tokens_of,
)
from proxy.pipeline.compaction.checkpoints import (
    Checkpoint,
    CheckpointIndex,
    Mark,
    SessionState,
    key_of,
)
from proxy.pipeline.compaction.intent import intent_of
from proxy.pipeline.compaction.memo import DEFAULT_MAX_CHARS, Seen, SeenHistories
from proxy.pipeline.compaction.overflow import compact_after_overflow
from proxy.pipeline.compaction.plan import Plan
from proxy.pipeline.compaction.summarize import (
    STAGE,
    history_entry,
    replace_stretch,
    summary_room,
)
from proxy.pipeline.compaction.truncate import Truncator
from proxy.pipeline.messages import Message
from proxy.policies.spec import Policy

# A stretch smaller than this share of the window is not worth a summarizer call.
MIN_STRETCH_SHARE = 0.05
# Requests in flight only need their last output mapped back after an overflow: a small memo,
# bounded by the request bytes it keeps alive.
OUTPUTS_BYTES = 32 * 1024 * 1024


class CompactionStage:
    name = STAGE

    def __init__(
        self,
        sessions: int = 4096,
        memo_chars: int = DEFAULT_MAX_CHARS,
        outputs_bytes: int = OUTPUTS_BYTES,
        truncated_bytes: int = 16 * 1024 * 1024,
        checkpoint_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.index = CheckpointIndex(sessions, checkpoint_bytes)
        self.truncator = Truncator(truncated_bytes)
        self.seen = SeenHistories(memo_chars)
        # Used by overflow.py: per session, a signature of the last reactive recovery.
        self.recoveries: LRUCache[str, int] = LRUCache(sessions)
        # Per session, the last output and the input it came from: an overflow report may
        # hand back our own output, which is mapped back to the agent's history (requests
        # in flight only, so a small cache will do).
        self._outputs: LRUCache[str, tuple[int, list[Message], list[Message]]] = LRUCache(
            outputs_bytes, getsizeof=lambda entry: entry[0]
        )

    def memos(self) -> dict[str, LRUCache[Any, Any]]:
        return {
            "compaction_histories": self.seen.memo,
            "compaction_outputs": self._outputs,
            "truncated_arguments": self.truncator.memo,
            "checkpoints": self.index.memo,
        }

    def forget(self, sessions: set[str]) -> None:
        forget_sessions(
            sessions,
            named=[self.seen.memo, self._outputs, self.recoveries, self.index.states],
            led=[self.truncator.memo, self.index.memo],
        )

    def enabled(self, policy: Policy) -> bool:
        return policy.compaction.enabled

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        budget = budget_for(ex, ctx)
        if budget is None:
            return None
        spec = ex.policy.compaction
        # When no earlier stage changed the client's list, the chain already knows how much of
        # it the session sent before: no need to compare it again.
        aligned = messages is ex.messages
        seen = self.seen.remember(
            ex.identity.session,
            messages,
            known_shared=lambda basis: reusable(ex, messages, basis),
            basis=ex.rewrite.turn if aligned else None,
        )
        # Counted exactly near the trigger, calibrated against the provider (tokens/meter.py):
        # the budget is then in the measure's units.
        measure = await ctx.meter.measure(ex, seen, budget.fixed, budget.limit(spec.trigger))
        budget, tokens = budget.scaled(measure.factor, measure.fixed), measure.total
        state = self.index.peek(ex.identity.session)
        if state is None:
            # Only a session that overflowed has a smaller window than the catalog's, and such
            # a session is in memory (or, after a restart, overflows once more and is loaded).
            if tokens <= budget.limit(spec.trigger):
                return None
            state = await self.index.state(ctx.store, ex.identity.session)
        budget = budget.capped(state.cap_for(_model(ex)))
        trigger = budget.limit(spec.trigger)
        if tokens <= trigger:
            return None
        target = budget.limit(min(spec.target, spec.trigger))
        async with state.lock:
            output = await self._fit(ex, seen, ctx, budget, (trigger, target), state)
        if output is not None:
            size = max(1, ex.client.body_bytes or 64 * len(output))
            if size <= self._outputs.maxsize:
                self._outputs[ex.identity.session] = (size, output, seen.messages)
        return output

    async def after_overflow(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        """The on-overflow hook: the provider said `messages` overflow; the history to retry
        with, or None to pass its error on (overflow.py)."""
        return await compact_after_overflow(ex, messages, ctx, self)

    async def compact_to(
        self, ex: Exchange, messages: list[Message], ctx: StageContext, fraction: float
    ) -> list[Message] | None:
        """The reactive path: the provider said `messages` overflow. From now on the session's
        window counts as no larger than what was sent (with the answer's reservation); compact
        to `fraction` of that.

        `messages` is what was sent, perhaps this stage's own output (extended since, e.g. by
        recall rounds): it is mapped back to the agent's history so checkpoints keep matching."""
        sent = schema_tokens(ex.body.get("tools")) + tokens_of(messages)
        reserved = reserved_output(ex.body)
        needed = sent + reserved  # what overflowed: the window is smaller than this
        session = ex.identity.session
        seen = self.seen.remember(session, self._as_input(session, messages))
        budget = budget_for(ex, ctx)
        if budget is None:  # window unknown: what just overflowed is our best guess at it
            budget = budget_for(ex, ctx, window=needed)
        if budget is None:
            return None
        state = await self.index.state(ctx.store, session)
        cap = state.cap_for(_model(ex))
        # Learn the window only when the prompt is to blame: an overflow caused mostly by the
        # answer's reservation (max_tokens) says little of what prompt fits, and learning
        # from it would shrink every later turn (a tiny prompt would teach a tiny window).
        # Nor below a prompt the model took in this session: an overflow at less than that
        # says the text got denser, not that the window shrank.
        learnt = max(needed, state.floor_for(_model(ex)))
        if sent > reserved and (cap is None or learnt < cap):
            state.window_cap, state.window_model = learnt, _model(ex)
            await self._save(ex, ctx, state)
        budget = budget.capped(min(needed, cap) if cap else needed)
        limit = budget.limit(fraction)
        async with state.lock:
            return await self._fit(ex, seen, ctx, budget, (limit, limit), state)

    def accepted(self, ex: Exchange) -> None:
        """The model took this request: a session that learnt a window keeps the largest
        prompt taken as the floor of what it may learn next (only in memory until its index
        is saved again; a session that never overflowed pays a dict lookup)."""
        state = self.index.peek(ex.identity.session)
        if state is None or state.window_cap is None or ex.deployment is None:
            return
        tokens = schema_tokens(ex.body.get("tools")) + tokens_of(ex.messages)
        state.accepted(ex.deployment.model, tokens + reserved_output(ex.body))

    def _as_input(self, session: str, messages: list[Message]) -> list[Message]:
        last = self._outputs.get(session)
        if last is None:
            return messages
        _, output, source = last
        if messages[: len(output)] != output:
            return messages
        return [*source, *messages[len(output) :]]

    async def _fit(
        self,
        ex: Exchange,
        seen: Seen,
        ctx: StageContext,
        budget: Budget,
        limits: tuple[int, int],
        state: SessionState,
    ) -> list[Message] | None:
        """`limits`: (trigger, target) in tokens. Past the trigger, a compaction event
        compacts to the target."""
        trigger, target = limits
        messages = seen.messages
        head = head_length(messages)
        plan = Plan(seen, head, budget.fixed, base=head, tail=messages[head:])
        hashes = seen.prefix_hashes(state.needed_length())
        await self._reuse_checkpoint(ex, ctx, state, plan, hashes)
        truncation = state.truncation
        horizon = truncation.length if truncation and truncation.holds(hashes) else 0
        spec = ex.policy.compaction
        # A tight (reactive) target shrinks the verbatim part too: half of it at most.
        keep_tokens = min(int(spec.keep_recent * budget.window), target // 2)
        recent = recent_start(seen.costs, plan.base, keep_tokens, spec.keep_messages)
        if horizon > plan.base or plan.tokens() > trigger:
            await self._truncate(ex, ctx, state, plan, horizon, recent, trigger)
        if plan.tokens() > trigger:
            await self._summarize(ex, ctx, state, plan, recent, budget.window, target)
        output = plan.output()
        if ex.prompt is not None:  # what is sent, for the calibration
            ex.prompt.sent(plan.tokens(), len(output if output is not None else messages))
        return output

    async def _reuse_checkpoint(
        self, ex: Exchange, ctx: StageContext, state: SessionState, plan: Plan, hashes: list[int]
    ) -> None:
        mark = state.longest_checkpoint(hashes)
        if mark is None or not plan.base <= mark.length < len(plan.seen.messages):
            return
        checkpoint = await self.index.body(ctx.store, ex.identity.session, mark)
        if checkpoint is None:
            return
        before = plan.tokens()
        plan.rebase(mark.length, checkpoint.fresh_messages())
        record(
            ex, ctx, STAGE, "checkpoint_reused", tokens_before=before,
            tokens_after=plan.tokens(), messages=mark.length, ref=checkpoint.ref,
        )  # fmt: skip

    async def _truncate(
        self,
        ex: Exchange,
        ctx: StageContext,
        state: SessionState,
        plan: Plan,
        horizon: int,
        recent: int,
        trigger: int,
    ) -> None:
        """Re-apply the stored horizon (same bytes as last turn); move it up to the recent
        part only when still over the trigger (a compaction event)."""
        messages = plan.seen.messages
        before = plan.tokens()
        stop = horizon
        done = await self.truncator.apply(ex, ctx.archive, messages, plan.base, stop)
        plan.saved = done.saved
        old_count = done.arguments
        if plan.tokens() > trigger and recent > max(horizon, plan.base):
            stop = recent
            done = await self.truncator.apply(ex, ctx.archive, messages, plan.base, stop)
            plan.saved = done.saved
        if not done.arguments:
            return
        plan.tail = done.messages + messages[max(stop, plan.base) :]
        plan.changed = True
        if stop > horizon and done.arguments > old_count:
            state.truncation = Mark(stop, key_of(plan.seen.prefix_hashes(stop)[-1]))
            await self._save(ex, ctx, state)
        record(
            ex, ctx, STAGE, "truncated_arguments", tokens_before=before,
            tokens_after=plan.tokens(), arguments=done.arguments, new=done.stored,
        )  # fmt: skip

    async def _summarize(
        self,
        ex: Exchange,
        ctx: StageContext,
        state: SessionState,
        plan: Plan,
        recent: int,
        window: int,
        target: int,
    ) -> None:
        messages = plan.seen.messages
        cut = choose_cut(messages, plan.base, recent)
        if cut is None:
            return  # nothing old enough to summarize without splitting a tool call
        if sum(plan.seen.costs[plan.base : cut]) < MIN_STRETCH_SHARE * window:
            return  # the target is out of reach; a summarizer call per turn would not help
        before = plan.tokens()
        raw = messages[plan.base : cut]
        stretch = [*plan.inserted, *raw]
        archived = history_entry(ex, stretch, plan.base, cut - 1)
        if archived.ref not in await ctx.archive.keep(ex, STAGE, [archived]):
            return  # nothing leaves the context unless it is stored
        ref = archived.ref
        pattern = ex.policy.compaction.intent
        intent = intent_of(plan.inserted, raw, pattern, window, ref)
        kept = before - tokens_of(plan.inserted) - sum(plan.seen.costs[plan.base : cut])
        kept += sum(t for i, t in plan.saved.items() if plan.base <= i < cut)  # saved there
        room = summary_room(window, target, kept, tokens_of(intent))
        started = time.perf_counter()
        replacement, kind = await replace_stretch(ex, ctx, intent, stretch, ref, room)
        seconds = round(time.perf_counter() - started, 3)
        mark = Mark(cut, key_of(plan.seen.prefix_hashes(cut)[-1]))
        checkpoint = Checkpoint(mark, kind, tuple(replacement), ref)
        try:
            await self.index.add(ctx.store, ex.identity.session, state, checkpoint)
        except Exception as exc:  # this turn still fits; the next one recomputes
            record(ex, ctx, STAGE, "store_failed", error=f"{type(exc).__name__}: {exc}")
        plan.rebase(cut, checkpoint.fresh_messages())
        action = "summarized" if kind == "summary" else "middle_out"
        record(
            ex, ctx, STAGE, action, tokens_before=before, tokens_after=plan.tokens(),
            messages=len(stretch), ref=ref, summarizer_seconds=seconds,
        )  # fmt: skip

    async def _save(self, ex: Exchange, ctx: StageContext, state: SessionState) -> None:
        try:
            await self.index.save(ctx.store, ex.identity.session, state)
        except Exception as exc:
            record(ex, ctx, STAGE, "store_failed", error=f"{type(exc).__name__}: {exc}")


def _model(ex: Exchange) -> str:
    """Whose window an overflow taught: windows differ between models (fallbacks)."""
    return ex.deployment.model if ex.deployment is not None else ""
