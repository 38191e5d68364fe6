"""Calls the proxy makes for a session outside any request (a summary written ahead of the
compaction trigger): checked against the session's budgets before, and counted and charged
after, as a request's own summaries are when it finishes (flow.py)."""

from __future__ import annotations

from proxy.exchange import Exchange, Usage
from proxy.pipeline.base import StageContext
from proxy.pipeline.budget import BudgetStage


class AsideCharges:
    """The compaction stage's Ledger (compaction/prepared.py)."""

    def __init__(self, ctx: StageContext, budgets: BudgetStage) -> None:
        self.ctx = ctx
        self.budgets = budgets

    async def allows(self, ex: Exchange, prompt: int, completion: int) -> bool:
        if not ex.policy.budgets or ex.dry_run:
            return True
        return await self.budgets.allows(ex, self.ctx, prompt, completion)

    async def charge(self, ex: Exchange) -> None:
        """Tokens and cost to the metrics under the summarizer's model, then to the budgets
        (no call counted: summaries are not the agent's calls)."""
        metrics, catalog = self.ctx.metrics, self.ctx.catalog
        usage: Usage | None = None
        cost = 0.0
        for side in ex.accounting.side_calls:
            used = side.usage
            metrics.child(metrics.tokens, side.alias, "prompt").inc(used.prompt_tokens)
            metrics.child(metrics.tokens, side.alias, "completion").inc(used.completion_tokens)
            side_cost = catalog.cost(side.deployment, used) if side.deployment else None
            if side_cost:
                metrics.child(metrics.cost, side.alias).inc(side_cost)
                metrics.child(metrics.summarizer_cost, side.alias).inc(side_cost)
                cost += side_cost
            if usage is None:
                usage = Usage()
            usage.add(used)
        ex.accounting.side_calls.clear()  # charged once
        if usage is not None and ex.policy.budgets and not ex.dry_run:
            await self.budgets.charge(ex, self.ctx, usage, cost, calls=0)
