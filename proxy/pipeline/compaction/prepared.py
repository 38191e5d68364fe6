"""Summaries written ahead of the trigger (compaction.prepare_at), so the turn that crosses it
does not wait for a summarizer call.

Histories are append-only and a summary is keyed by the prefix it replaces (a Mark), so the
stretch the next compaction will summarize can be summarized a few turns early: the crossing
turn takes it when its prefix still holds, else summarizes inline as before.

Bounded: one per session, `limit` in flight in the process, each under its own deadline
(summarizer_timeout_s) and skipped when the session's or key's budget would not allow it.
Its spend is charged to the session's budgets when it ends (a Ledger), used or not. Dropped
(cancelled if still running) when its session goes idle (forget), when the history moved
away from it, and on shutdown (close). Counted in agentproxy_compaction_prepared_total.

On a shared store (Redis, several replicas) a written summary is also shared, and a crossing
turn with none of its own takes one another replica wrote (shared_prepared.py); a round
another replica claimed is not written here (counted `elsewhere`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from proxy.exchange import ClientRequest, Exchange, Timing
from proxy.messages import Message
from proxy.metrics import Metrics
from proxy.pipeline.base import StageContext
from proxy.pipeline.compaction import shared_prepared
from proxy.pipeline.compaction.budget import tokens_of
from proxy.pipeline.compaction.checkpoints import Mark
from proxy.pipeline.compaction.shared_prepared import SharedSummary
from proxy.store.base import StoreError

log = logging.getLogger("agentproxy.compaction")

# Finished summaries waiting for their crossing turn, at most (each a few KB); idle sessions
# leave sooner (forget).
MAX_WAITING = 4096
HashesTo = Callable[[int], Sequence[int]]


class Ledger(Protocol):
    """Spend outside a request: may a call of about `prompt` tokens in and `completion` out
    go ahead, and charge what the exchange's side calls used to its scopes' budgets."""

    async def allows(self, ex: Exchange, prompt: int, completion: int) -> bool: ...

    async def charge(self, ex: Exchange) -> None: ...


@dataclass(slots=True)
class Prepared:
    """A summary of messages[base:mark.length] (after the checkpoint's `inserted`), being
    written or written."""

    base: int
    mark: Mark
    room: int  # the tokens it was asked to fit in
    task: asyncio.Task[str | None]
    metrics: Metrics
    started: float = field(default_factory=time.perf_counter)
    # Shared with the other replicas: one of them may have used it, so it is not counted
    # wasted when this one drops it.
    published: bool = False

    async def summary(self) -> str | None:
        """The summary, waiting for it if still being written (never cancelling it: a
        client that leaves does not waste it); None if it failed."""
        return await asyncio.shield(self.task)


class PreparedSummaries:
    def __init__(self, limit: int = 4, ledger: Ledger | None = None) -> None:
        self.limit = limit
        self.ledger = ledger
        self._by_session: dict[str, Prepared] = {}
        self._running: set[asyncio.Task[str | None]] = set()
        self.replica = shared_prepared.replica_id()  # this one's name in claims

    def __len__(self) -> int:
        return len(self._by_session)

    def pending(self, session: str) -> Prepared | None:
        return self._by_session.get(session)

    def start(
        self,
        ex: Exchange,
        ctx: StageContext,
        stretch: list[Message],
        base: int,
        mark: Mark,
        room: int,
        kept: int = 0,
    ) -> bool:
        """Start writing the summary of `stretch` for the exchange's session, unless one is
        there already or the process has `limit` in flight. Synchronous up to the task's
        creation, so concurrent turns of a session start one at most. `room`: the tokens the
        summary will have; `kept`: those of them kept for the ledger (not asked for)."""
        session = ex.identity.session
        if session in self._by_session:
            return False
        if len(self._running) >= self.limit or len(self._by_session) >= MAX_WAITING:
            _count(ctx.metrics, "skipped")
            return False
        carrier = _carrier(ex)
        shared = SharedSummary(ex.identity.owner, base, mark, room, "")
        task = asyncio.create_task(self._write(carrier, ctx, stretch, room - kept, shared))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        self._by_session[session] = Prepared(base, mark, room, task, ctx.metrics)
        return True

    def take(self, session: str, base: int, hashes: Sequence[int]) -> Prepared | None:
        """The session's summary if it summarizes from `base` a prefix these hashes still
        have; one that no longer fits is dropped (wasted)."""
        prepared = self._by_session.pop(session, None)
        if prepared is None:
            return None
        if prepared.base == base and prepared.mark.holds(hashes):
            return prepared
        self.waste(prepared)
        return None

    def drop_stale(self, session: str, base: int, hashes: Sequence[int]) -> bool:
        """Whether the session has a summary being written or written that still fits; one
        that does not is dropped (wasted)."""
        prepared = self._by_session.get(session)
        if prepared is None:
            return False
        if prepared.base == base and prepared.mark.holds(hashes):
            return True
        del self._by_session[session]
        self.waste(prepared)
        return False

    def used(self, prepared: Prepared) -> None:
        _count(prepared.metrics, "used")

    def waste(self, prepared: Prepared) -> None:
        """Never used: cancelled if still being written; counted unless it failed."""
        task = prepared.task
        if not task.done():
            task.cancel()
            _count(prepared.metrics, "wasted")
        elif not task.cancelled() and task.result() is not None and not prepared.published:
            _count(prepared.metrics, "wasted")

    async def find_shared(
        self, ex: Exchange, ctx: StageContext, base: int, hashes_to: HashesTo
    ) -> SharedSummary | None:
        """On a shared store: the summary another replica wrote ahead for this owner's session,
        if it summarizes from `base` a prefix the history still has (`hashes_to(n)`: the
        prefix hashes of its first n messages). One store read; None when the store fails."""
        at = ex.policy.compaction.prepare_at
        if not ctx.store.shared or self.limit <= 0 or at is None or at >= 1:
            return None  # no replica writes any ahead for this policy: nothing to read
        try:
            found = await shared_prepared.find(ctx.store, ex.identity.session)
        except Exception as exc:  # a slow or absent store: summarized inline, as before
            log.debug("no shared summary read: %s: %s", type(exc).__name__, exc)
            return None
        if found is None or not found.fits(ex.identity.owner, base, hashes_to(found.mark.length)):
            return None
        return found

    def used_shared(self, metrics: Metrics) -> None:
        _count(metrics, "used")

    def forget(self, sessions: set[str]) -> None:
        for session in sessions:
            prepared = self._by_session.pop(session, None)
            if prepared is not None:
                self.waste(prepared)

    async def close(self) -> None:
        """Shutdown: every summary still being written is cancelled and awaited."""
        for prepared in list(self._by_session.values()):
            self.waste(prepared)
        self._by_session.clear()
        running = list(self._running)
        for task in running:
            if not task.cancelling():  # once: a second cancel would cut its charge short
                task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    async def _write(
        self,
        carrier: Exchange,
        ctx: StageContext,
        stretch: list[Message],
        room: int,
        shared: SharedSummary,
    ) -> str | None:
        """The summary, or None (failures are counted, never raised: nobody may be waiting).
        `shared`: what it will be shared as (its summary still empty)."""
        metrics = ctx.metrics
        spec = carrier.policy.compaction
        ledger = self.ledger
        session = carrier.identity.session
        try:
            if ledger is not None and not await ledger.allows(carrier, tokens_of(stretch), room):
                _count(metrics, "skipped")
                return None
            if ctx.store.shared and not await self._claim(ctx, session, shared.base):
                _count(metrics, "elsewhere")
                return None
            _count(metrics, "started")
            summary = await asyncio.wait_for(
                ctx.summarize(carrier, stretch, room), spec.summarizer_timeout_s
            )
            if not summary.strip():
                raise ValueError("the summarizer returned an empty summary")
            if ctx.store.shared:
                await self._publish(ctx, session, replace(shared, summary=summary))
            return summary  # its sections are checked where it is used, as inline
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the crossing turn summarizes inline instead
            _count(metrics, "failed")
            log.debug("prepared summary failed: %s: %s", type(exc).__name__, exc)
            return None
        finally:
            if ledger is not None and carrier.accounting.side_calls:
                # Charged used or not, cancelled included: the provider bills it anyway.
                with contextlib.suppress(Exception):
                    await ledger.charge(carrier)

    async def _claim(self, ctx: StageContext, session: str, base: int) -> bool:
        """Whether this replica writes the round's summary; yes when the claim fails."""
        try:
            return await shared_prepared.claim(ctx.state, session, base, self.replica)
        except StoreError as exc:
            log.debug("summary written ahead unclaimed: %s", exc)
            return True

    async def _publish(self, ctx: StageContext, session: str, shared: SharedSummary) -> None:
        """For the other replicas' crossing turns; this one's takes it from memory."""
        try:
            if not await shared_prepared.publish(ctx.store, session, shared):
                return
        except Exception as exc:  # this replica still has it
            log.debug("summary written ahead not shared: %s: %s", type(exc).__name__, exc)
            return
        prepared = self._by_session.get(session)
        if prepared is not None and prepared.task is asyncio.current_task():
            prepared.published = True


def _carrier(ex: Exchange) -> Exchange:
    """The background summary's own exchange: the request's owner, session, key, policy and
    deployment, but its own clock and record (the request may be over long before)."""
    carrier = Exchange(
        identity=ex.identity,
        config=ex.config,
        body={},
        alias=ex.alias,
        policy=ex.policy,
        client=ClientRequest(route=ex.client.route, wire=ex.client.wire),
        deployment=ex.deployment,
        timing=Timing(),
    )
    return carrier


def _count(metrics: Metrics, result: str) -> None:
    metrics.child(metrics.compaction_prepared, result).inc()
