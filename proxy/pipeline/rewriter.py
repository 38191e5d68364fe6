"""The history pipeline as a request uses it: rewrite before the call, recover after it."""

from __future__ import annotations

from typing import Any

from cachetools import LRUCache

from proxy.exchange import Exchange, Usage
from proxy.guards.secrets.placeholders import Minter
from proxy.pipeline import capabilities, recall
from proxy.pipeline.aside import AsideCharges
from proxy.pipeline.base import StageContext, record
from proxy.pipeline.budget import BudgetStage
from proxy.pipeline.capabilities import CapabilityStage
from proxy.pipeline.chain import Chain
from proxy.pipeline.compaction import CompactionStage
from proxy.pipeline.compat import STAGE, CompatStage, Quirks, adapt
from proxy.pipeline.context_edits import ContextEditStage
from proxy.pipeline.loops import LoopStage
from proxy.pipeline.offload import OffloadStage
from proxy.pipeline.repair import RepairStage
from proxy.pipeline.scrub import ScrubStage
from proxy.policies.spec import Deployment
from proxy.upstream import no_chat
from proxy.upstream.base import UpstreamHTTPError
from proxy.upstream.facts import DeploymentFacts, as_chat_note

MB = 1024 * 1024
# How server.memo_mb is shared between the warm-turn memos ("turn_memory": the routes'
# TurnMemory, each session's last turn and what was relayed to it).
# The four that keep whole histories mostly hold the same message objects, so their sum
# overstates what they keep alive.
MEMO_SHARES = {
    "histories": 0.25,
    "guard_secrets": 0.03125,  # each session's secrets, by placeholder, and its last scan
    "loop_calls": 0.015625,  # the calls of each session's recent tool-call turns
    "turn_memory": 0.0625,  # and the thinking relayed, to put back what clients drop
    "offload_turns": 0.1875,
    "compaction_histories": 0.1875,
    "compaction_outputs": 0.0859375,
    "client_compactions": 0.0078125,  # summaries written for clients' compact edits
    "offload_pointers": 0.05,
    "truncated_arguments": 0.05,
    "checkpoints": 0.05,
    "token_ratios": 0.0125,  # per session and model: the calibration (pipeline/meter.py)
    "token_counts": 0.009375,  # exact counts of long texts, by hash
}


class Rewriter:
    def __init__(
        self,
        ctx: StageContext,
        memo_bytes: int = 256 * MB,
        prepared_summaries: int = 4,
        facts: DeploymentFacts | None = None,
    ) -> None:
        self.ctx = ctx
        # What rejections teach of the deployments: the app's, shared with its upstreams.
        self.facts = facts if facts is not None else DeploymentFacts()
        size = {name: max(1, int(share * memo_bytes)) for name, share in MEMO_SHARES.items()}
        # Guards run after the rewrites: a loop note appended at the end then costs the
        # incremental stages nothing, and budgets judge the request as it will be sent.
        self.budgets = BudgetStage()
        self.compaction = CompactionStage(
            memo_chars=size["compaction_histories"],
            outputs_bytes=size["compaction_outputs"],
            truncated_bytes=size["truncated_arguments"],
            checkpoint_bytes=size["checkpoints"],
            prepared=prepared_summaries,
            ledger=AsideCharges(ctx, self.budgets),  # summaries written ahead: their spend
        )
        self.offload = OffloadStage(size["offload_pointers"], size["offload_turns"])
        self.repair = RepairStage()
        self.loops = LoopStage(size["loop_calls"])
        self.minter = Minter()  # the guard's placeholders: the app gives it the store's key
        self.quirks = Quirks(self.facts)
        # The stages, one registration line each, in the order the chain calls their hooks.
        self.chain = Chain(
            [
                # First: no stage sees (or stores) a secret.
                ScrubStage(size["guard_secrets"], self.minter),
                self.repair,
                CompatStage(self.quirks),
                CapabilityStage(),
                ContextEditStage(size["client_compactions"]),  # the client's own edits
                self.offload,
                self.compaction,
                self.loops,
                self.budgets,
            ],
            memo_bytes=size["histories"],
        )

    def memos(self) -> dict[str, LRUCache[Any, Any]]:
        """The byte-bounded in-process memos that make warm turns cheap, by name."""
        return self.chain.memos()

    def forget(self, sessions: set[str]) -> None:
        """Drop everything remembered about these sessions (idle: the store may evict their
        data next, and no memo may then name what it no longer holds)."""
        self.chain.forget(sessions)

    async def close(self) -> None:
        """Shutdown: background work (summaries written ahead) cancelled and awaited."""
        await self.compaction.close()

    async def before_call(self, ex: Exchange) -> None:
        """Repair, offload, fit to the target window; offer recall if anything left."""
        first = ex.client.original_messages is None
        if first:
            ex.client.original_messages = ex.messages  # stages never mutate it: no copy needed
        await self.chain.rewrite(ex, self.ctx)
        if first:
            self._count_context(ex)
        if not ex.dry_run and recall.should_offer(ex):
            recall.offer(ex.body)

    def _count_context(self, ex: Exchange) -> None:
        """Prompt size in and out, estimated at four bytes of request JSON per token."""
        metrics = self.ctx.metrics
        received = ex.client.body_bytes // 4
        metrics.child(metrics.context_tokens, "received").inc(received)
        sent = received if ex.dry_run else max(0, received - ex.rewrite.tokens_saved)
        metrics.child(metrics.context_tokens, "sent").inc(sent)

    def accepted(self, ex: Exchange) -> None:
        """The model took the request as sent (compaction learns what the window holds)."""
        if not ex.client.opaque_history:
            self.chain.accepted(ex)

    async def after_call(
        self, ex: Exchange, usage: Usage | None, cost: float | None, calls: int
    ) -> None:
        """Charge what the request really used (its summaries included) to its budgets."""
        if not ex.dry_run:
            await self.chain.after_call(ex, self.ctx, usage, cost, calls)

    async def refit(self, ex: Exchange) -> None:
        """A fallback took over: the client's own history again, rewritten for the new
        ex.deployment (its window, its capabilities). Re-sending a history is safe for every
        stage: the chain sees the same turn again, as after a client's retry."""
        if ex.client.original_messages is not None:
            ex.body["messages"] = ex.client.original_messages
        capabilities.restore(ex)  # what an earlier fallback's capabilities took away
        if recall.offered(ex.body):
            recall.withdraw(ex.body)
        await self.before_call(ex)

    async def after_rejection(self, ex: Exchange, error: UpstreamHTTPError) -> bool:
        """The deployment refused the request as invalid: True when a compatibility shim it
        turned out to need (compat.py) now changed the request, so it is worth sending again."""
        deployment = ex.deployment
        if deployment is not None and self._learnt_chat_only(ex, deployment, error):
            # A stream is re-asked whole by its route (responses/route.py), not re-opened here.
            return not ex.client.stream
        if deployment is not None and self._learnt_no_chat(ex, deployment, error):
            return True  # a stream too: it is re-opened as Responses, translated by its relay
        if ex.dry_run or ex.client.opaque_history or deployment is None:
            return False
        if not self.quirks.learn(deployment, error.body, ex.messages):
            return False
        adapted = adapt(ex, self.ctx, ex.messages)
        if adapted is None:
            return False
        ex.body["messages"] = adapted
        return True

    def _learnt_chat_only(
        self, ex: Exchange, deployment: Deployment, error: UpstreamHTTPError
    ) -> bool:
        """A request its `openai/` deployment answered 404 on its wire's native route (one
        its native upstream says may be missing: /v1/responses): the server speaks only chat,
        so the request goes as chat from now on (DeploymentFacts.native_route)."""
        if ex.translated:  # its 404 came from chat
            return False
        wire = ex.client.wire
        if not self.facts.learn_native_route(wire, deployment, error.status, error.body):
            return False
        record(ex, self.ctx, STAGE, as_chat_note(wire))
        return True

    def _learnt_no_chat(
        self, ex: Exchange, deployment: Deployment, error: UpstreamHTTPError
    ) -> bool:
        """A chat request its `openai/` deployment answered on the route as a server without
        it, or as OpenAI for a Responses-only model: the request goes as Responses from now
        on, when the client's wire has a way there (proxy/upstream/no_chat.py)."""
        alternate = ex.client.alternate
        if alternate is None or not alternate.reaches(deployment):
            return False  # no way there but chat
        if alternate.applies(deployment):
            return False  # its error came from the other wire
        if not self.facts.no_chat.learn(deployment, error.status, error.body):
            return False
        record(ex, self.ctx, STAGE, no_chat.NOTE)
        return True

    def adapt_appended(self, ex: Exchange) -> None:
        """The history grew outside the chain (a recall round): shim it for the deployment."""
        deployment = ex.deployment
        if ex.dry_run or deployment is None or not self.quirks.needs_empty_content(deployment):
            return
        adapted = adapt(ex, self.ctx, ex.messages)
        if adapted is not None:
            ex.body["messages"] = adapted

    async def after_overflow(self, ex: Exchange) -> bool:
        """The provider said the context is exceeded: compact tighter. False = give up."""
        if ex.dry_run or ex.client.opaque_history:
            return False
        compacted = await self.chain.after_overflow(ex, self.ctx)
        if compacted is None:
            return False
        ex.body["messages"] = compacted
        if recall.should_offer(ex):
            recall.offer(ex.body)
        return True
