"""Fit the history to the target model's context window.

Proactive: when the estimate (messages + tool schemas, with room kept for the answer) passes
`trigger` of the window, in order and stopping as soon as it is back under the trigger:
  0. reuse the longest checkpoint whose prefix matches (byte for byte, no summarizer call);
  a. truncate long string arguments of old writing-tool calls (truncate.py);
  b. archive the older part, then replace it with the session's intent (intent.py) and a
     structured summary, and checkpoint that;
  d. if the summarizer fails, is too slow or answers without the required sections, cut the
     middle out instead (the intent and a marker).
Ahead of time (prepared.py): past `prepare_at` of the trigger, the summary of step b is
written in the background; the turn that crosses the trigger takes it when the prefix it
summarizes still holds (waiting for it if still being written), else summarizes inline.
A compaction event (a, b, d) compacts to `target`, well under the trigger, so the next event is
several turns away rather than on the very next turn.
Reactive (overflow.py): the same steps to a tighter target once the provider said it
overflowed; from then on the session's window counts as no larger than what overflowed (kept in
provider tokens, read in each turn's measure units), but
never smaller than a prompt the model took in this session (what it really takes).

Stability: every output is head + replacement + messages[cut:], where the replacement comes
from a checkpoint and old arguments truncate deterministically up to a stored horizon, so
between compaction events appending to the input appends to the output.

Cost: a warm turn estimates and hashes only the new messages (memo.py); a turn under
the trigger costs that estimate and nothing else.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from proxy.exchange import Exchange
from proxy.messages import Message
from proxy.pipeline.archive import Entry
from proxy.pipeline.base import StageContext, forget_sessions, record, reusable
from proxy.pipeline.compaction.artifacts import ArtifactLedger
from proxy.pipeline.compaction.budget import (
    Budget,
    budget_for,
    choose_cut,
    head_length,
    message_tokens,
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
from proxy.pipeline.compaction.prepared import Ledger, PreparedSummaries
from proxy.pipeline.compaction.summarize import (
    STAGE,
    history_entry,
    ledger_room,
    replace_stretch,
    summary_replacement,
    summary_room,
)
from proxy.pipeline.compaction.truncate import Truncator
from proxy.policies.spec import CompactionSpec, Policy

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
        prepared: int = 4,
        ledger: Ledger | None = None,
    ) -> None:
        # Summaries written ahead of the trigger: `prepared` in flight in the process at most.
        self.prepared = PreparedSummaries(prepared, ledger)
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
        self.prepared.forget(sessions)

    async def close(self) -> None:
        """Shutdown: the summaries still being written ahead are cancelled."""
        await self.prepared.close()

    def enabled(self, policy: Policy) -> bool:
        return policy.compaction.enabled

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        budget = budget_for(ex, ctx) or self._learnt_budget(ex, ctx)
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
        # Counted exactly near the trigger, calibrated against the provider (pipeline/meter.py):
        # the budget is then in the measure's units.
        measure = await ctx.meter.measure(ex, seen, budget.fixed, budget.limit(spec.trigger))
        budget, tokens = budget.scaled(measure.factor, measure.fixed), measure.total
        yields = yields_to_client(ex)
        state = self.index.peek(ex.identity.session)
        if state is None:
            # Only a session that overflowed has a smaller window than the catalog's, and such
            # a session is in memory (or, after a restart, overflows once more and is loaded).
            if tokens <= budget.limit(spec.trigger):
                if tokens > _prepare_limit(spec, budget.limit(spec.trigger)) and not yields:
                    self._prepare_first(ex, seen, ctx, budget)
                return None
            state = await self.index.state(ctx.store, ex.identity.session)
        # The learnt window is in provider tokens, the budget now in the measure's units.
        budget = budget.capped(_in_units(state.cap_for(_model(ex)), measure.factor))
        trigger = budget.limit(spec.trigger)
        if tokens <= trigger:
            return None
        if yields:  # the client cuts this history itself: one owner of the context
            record(ex, ctx, STAGE, "yielded", tokens=tokens, trigger=trigger)
            return None
        target = budget.limit(min(spec.target, spec.trigger))
        async with state.lock:
            output = await self._fit(ex, seen, ctx, budget, (trigger, target), state)
        if output is not None:
            size = max(1, ex.client.body_bytes or 64 * len(output))
            if size <= self._outputs.maxsize:
                self._outputs[ex.identity.session] = (size, output, seen.messages)
        return output

    def _learnt_budget(self, ex: Exchange, ctx: StageContext) -> Budget | None:
        """A window the catalog does not know: the one an overflow taught the session, if it
        is in memory (after a restart the session overflows once more and is loaded)."""
        state = self.index.peek(ex.identity.session)
        cap = state.cap_for(_model(ex)) if state is not None else None
        return budget_for(ex, ctx, window=cap) if cap else None

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
        # In provider tokens, like the catalog's window: what the provider said, else the
        # meter's measure of what was sent scaled by the session's calibration (an estimate
        # would be half of it on code).
        stated, window = ex.recovery.overflow
        sent = stated or await _provider_tokens(ex, ctx, messages)
        reserved = reserved_output(ex.body)
        needed = sent + reserved  # what overflowed: the window is smaller than this
        if window is not None and window < needed:
            needed = window  # the provider named its window: no need to guess it
        session = ex.identity.session
        seen = self.seen.remember(session, self._as_input(session, messages))
        budget = budget_for(ex, ctx)
        if budget is None:  # window unknown: what just overflowed is our best guess at it
            budget = budget_for(ex, ctx, window=needed)
        if budget is None:
            return None
        # The history is fitted in the measure's units, as on every turn (run).
        measure = await ctx.meter.measure(ex, seen, budget.fixed, 0)
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
        budget = budget.scaled(measure.factor, measure.fixed)
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
        state.accepted(ex.deployment.model, _taken_tokens(ex) + reserved_output(ex.body))

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
            await self._summarize(ex, ctx, plan, recent, (budget.window, trigger, target), state)
        elif plan.tokens() > _prepare_limit(spec, trigger):
            self._prepare(ex, ctx, plan, keep_tokens, (budget.window, trigger, target))
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
        plan.rebase(mark.length, checkpoint.fresh_messages(), checkpoint.ledger)
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

    def _prepare_first(self, ex: Exchange, seen: Seen, ctx: StageContext, budget: Budget) -> None:
        """A session under the trigger that never compacted: the first stretch, ahead."""
        if ex.dry_run or self.prepared.limit <= 0:
            return
        spec = ex.policy.compaction
        head = head_length(seen.messages)
        plan = Plan(seen, head, budget.fixed, base=head, tail=seen.messages[head:])
        trigger = budget.limit(spec.trigger)
        target = budget.limit(min(spec.target, spec.trigger))
        keep_tokens = min(int(spec.keep_recent * budget.window), target // 2)
        self._prepare(ex, ctx, plan, keep_tokens, (budget.window, trigger, target))

    def _prepare(
        self,
        ex: Exchange,
        ctx: StageContext,
        plan: Plan,
        keep_tokens: int,
        limits: tuple[int, int, int],
    ) -> None:
        """Past prepare_at of the trigger: start the summary the crossing turn will need,
        unless the session has one that still fits. The stretch is cut by _summarize's rule,
        counting what will come until the trigger as part of the verbatim recent part: the
        crossing turn then keeps about what it would have kept, not that much more."""
        if ex.dry_run or self.prepared.limit <= 0:
            return
        session = ex.identity.session
        pending = self.prepared.pending(session)
        if pending is not None:
            hashes = plan.seen.prefix_hashes(pending.mark.length)
            if self.prepared.drop_stale(session, plan.base, hashes):
                return
        window, trigger, target = limits
        spec = ex.policy.compaction
        coming = max(0, trigger - plan.tokens())
        recent = recent_start(
            plan.seen.costs, plan.base, max(0, keep_tokens - coming), spec.keep_messages
        )
        stretch = _stretch_of(ex, plan, recent, window)
        if stretch is None:
            return
        # Its room as it will be at the crossing, with what comes until then kept as well.
        room = summary_room(window, target, stretch.kept + coming, tokens_of(stretch.intent))
        mark = Mark(stretch.cut, key_of(plan.seen.prefix_hashes(stretch.cut)[-1]))
        kept = ledger_room(plan.ledger_to(stretch.cut), room)  # as the crossing turn will keep
        self.prepared.start(ex, ctx, stretch.messages, plan.base, mark, room, kept)

    async def _summarize(
        self,
        ex: Exchange,
        ctx: StageContext,
        plan: Plan,
        recent: int,
        limits: tuple[int, int, int],
        state: SessionState,
    ) -> None:
        """`limits`: (window, trigger, target) in tokens."""
        window, _, target = limits
        if await self._use_prepared(ex, ctx, plan, limits, state):
            return
        stretch = _stretch_of(ex, plan, recent, window)
        if stretch is None:
            return
        before = plan.tokens()
        archived = stretch.archived
        if archived.ref not in await ctx.archive.keep(ex, STAGE, [archived]):
            return  # nothing leaves the context unless it is stored
        room = summary_room(window, target, stretch.kept, tokens_of(stretch.intent))
        ledger = plan.ledger_to(stretch.cut)
        started = time.perf_counter()
        replacement, kind = await replace_stretch(
            ex, ctx, stretch.intent, stretch.messages, archived.ref, room, ledger
        )
        seconds = round(time.perf_counter() - started, 3)
        await self._checkpoint(ex, ctx, state, plan, stretch, (replacement, kind, ledger))
        action = "summarized" if kind == "summary" else "middle_out"
        record(
            ex, ctx, STAGE, action, tokens_before=before, tokens_after=plan.tokens(),
            messages=len(stretch.messages), ref=archived.ref, summarizer_seconds=seconds,
        )  # fmt: skip
        _count_compaction(ctx)

    async def _use_prepared(
        self,
        ex: Exchange,
        ctx: StageContext,
        plan: Plan,
        limits: tuple[int, int, int],
        state: SessionState,
    ) -> bool:
        """The summary written ahead for this session, if its prefix still holds and it brings
        the history well under the trigger: this process's, waited for if still being written
        (a second call would only take longer); else, on a shared store, one another replica
        wrote (shared_prepared.py)."""
        session = ex.identity.session
        found: tuple[Mark, int, str] | None = None  # its mark, room and summary
        prepared = None
        pending = self.prepared.pending(session)
        if pending is not None:
            hashes = plan.seen.prefix_hashes(pending.mark.length)
            prepared = self.prepared.take(session, plan.base, hashes)
        started = time.perf_counter()
        if prepared is not None:
            summary = await prepared.summary()  # None: failed, or another replica's to write
            if summary is not None:
                found = (prepared.mark, prepared.room, summary)
        if found is None:
            shared = await self.prepared.find_shared(ex, ctx, plan.base, plan.seen.prefix_hashes)
            if shared is not None:
                found, prepared = (shared.mark, shared.room, shared.summary), None
        waited = round(time.perf_counter() - started, 3)
        if found is None:
            return False  # summarized inline instead
        mark, room, summary = found
        window, trigger, target = limits
        stretch = _stretch_at(ex, plan, mark.length, window)
        # The room it was written for: whether it fits is checked next, not cut to fit.
        before = plan.tokens()
        ledger = plan.ledger_to(stretch.cut)
        replacement, kind = summary_replacement(
            ex, ctx, stretch.intent, stretch.messages, stretch.archived.ref, room, summary, ledger,
        )  # fmt: skip
        # Well under the trigger, or the next compaction would come a turn or two later:
        # no further above the target than halfway to the trigger.
        fits = stretch.kept + tokens_of(replacement) <= (target + trigger) // 2
        if not fits or stretch.archived.ref not in await ctx.archive.keep(
            ex, STAGE, [stretch.archived]
        ):  # nothing leaves the context unless it is stored
            if prepared is not None:
                self.prepared.waste(prepared)
            return False
        if prepared is not None:
            self.prepared.used(prepared)
        else:
            self.prepared.used_shared(ctx.metrics)
        await self._checkpoint(ex, ctx, state, plan, stretch, (replacement, kind, ledger))
        action = "summarized" if kind == "summary" else "middle_out"
        record(
            ex, ctx, STAGE, action, tokens_before=before, tokens_after=plan.tokens(),
            messages=len(stretch.messages), ref=stretch.archived.ref, summarizer_seconds=waited,
            prepared=True,
        )  # fmt: skip
        _count_compaction(ctx)
        return True

    async def _checkpoint(
        self,
        ex: Exchange,
        ctx: StageContext,
        state: SessionState,
        plan: Plan,
        stretch: Stretch,
        made: tuple[list[Message], str, ArtifactLedger],
    ) -> None:
        """Keep the replacement of the stretch (`made`: it, its kind and the ledger up to the
        cut) for later turns, and apply it to this one."""
        replacement, kind, ledger = made
        mark = Mark(stretch.cut, key_of(plan.seen.prefix_hashes(stretch.cut)[-1]))
        checkpoint = Checkpoint(mark, kind, tuple(replacement), stretch.archived.ref, ledger)
        try:
            await self.index.add(ctx.store, ex.identity.session, state, checkpoint)
        except Exception as exc:  # this turn still fits; the next one recomputes
            record(ex, ctx, STAGE, "store_failed", error=f"{type(exc).__name__}: {exc}")
        plan.rebase(stretch.cut, checkpoint.fresh_messages(), ledger)

    async def _save(self, ex: Exchange, ctx: StageContext, state: SessionState) -> None:
        try:
            await self.index.save(ctx.store, ex.identity.session, state)
        except Exception as exc:
            record(ex, ctx, STAGE, "store_failed", error=f"{type(exc).__name__}: {exc}")


@dataclass(slots=True)
class Stretch:
    """What a summary replaces: messages[base:cut] after what replaced the earlier ones."""

    cut: int
    messages: list[Message]  # [*plan.inserted, *raw]
    archived: Entry  # the raw stretch, for the archive
    intent: list[Message]
    kept: int  # tokens of the history without the stretch


def _stretch_of(ex: Exchange, plan: Plan, recent: int, window: int) -> Stretch | None:
    """The stretch a compaction summarizes now, or None: nothing old enough to summarize
    without splitting a tool call, or too small to be worth a summarizer call."""
    cut = choose_cut(plan.seen.messages, plan.base, recent)
    if cut is None:
        return None
    if sum(plan.seen.costs[plan.base : cut]) < MIN_STRETCH_SHARE * window:
        return None  # the target is out of reach; a summarizer call per turn would not help
    return _stretch_at(ex, plan, cut, window)


def _stretch_at(ex: Exchange, plan: Plan, cut: int, window: int) -> Stretch:
    raw = plan.seen.messages[plan.base : cut]
    stretch = [*plan.inserted, *raw]
    archived = history_entry(ex, stretch, plan.base, cut - 1)
    pattern = ex.policy.compaction.intent
    intent = intent_of(plan.inserted, raw, pattern, window, archived.ref)
    costs = plan.seen.costs
    kept = plan.tokens() - tokens_of(plan.inserted) - sum(costs[plan.base : cut])
    kept += sum(t for i, t in plan.saved.items() if plan.base <= i < cut)  # saved there
    return Stretch(cut, stretch, archived, intent, kept)


def _count_compaction(ctx: StageContext) -> None:
    """A compaction event of the proxy's own policy (agentproxy_context_edits_total)."""
    ctx.metrics.child(ctx.metrics.context_edits, "compaction", "proxy").inc()


def yields_to_client(ex: Exchange) -> bool:
    """Whether the proxy's compaction leaves this history to its client: the client manages
    its context (its own edits or compaction state cut it) and the policy honours that. An
    overflow is still recovered from (after_overflow): the request would fail otherwise."""
    context = ex.client.context
    return (
        context is not None
        and context.manages
        and ex.policy.compaction.client_managed != "override"
    )


def _prepare_limit(spec: CompactionSpec, trigger: int) -> float:
    """Past this many tokens, the next compaction's summary is written ahead (inf: off)."""
    at = spec.prepare_at
    return at * trigger if at is not None and at < 1 else float("inf")


def _model(ex: Exchange) -> str:
    """Whose window an overflow taught: windows differ between models (fallbacks)."""
    return ex.deployment.model if ex.deployment is not None else ""


def _in_units(window: int | None, factor: float) -> int | None:
    """A window in provider tokens, in the units of a measure worth `factor` of them each."""
    if window is None or factor == 1.0:
        return window
    return int(window / factor)


async def _provider_tokens(ex: Exchange, ctx: StageContext, messages: list[Message]) -> int:
    """`messages` and the tool schemas in provider tokens: counted with the model's tokenizer
    when one loads, scaled by the session's calibration. The request's own measure (what
    the calibration learns from after the call) is left as it was."""
    sent = Seen(list(messages), [message_tokens(m) for m in messages])
    kept = ex.prompt
    measure = await ctx.meter.measure(ex, sent, schema_tokens(ex.body.get("tools")), 0)
    ex.prompt = kept
    return int(measure.total * measure.factor + 0.5)


def _taken_tokens(ex: Exchange) -> int:
    """The prompt the model just took, in provider tokens: as it reported it (one call),
    else the request's measure scaled, else the estimate."""
    usage = ex.accounting.usage
    if usage is not None and ex.accounting.usage_reports == 1 and not ex.accounting.usage_estimated:
        return usage.prompt_tokens
    if ex.prompt is not None and ex.prompt.model == _model(ex):
        return ex.prompt.estimate
    return schema_tokens(ex.body.get("tools")) + tokens_of(ex.messages)
