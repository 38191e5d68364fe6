"""What a rewrite stage is, and what it may use.

A stage never mutates the messages it is given: it returns a new list (reusing unchanged
message dicts) or None when it has nothing to do. The chain checks the result against the
provider's pairing rules and keeps the previous list if the stage broke them or crashed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.events import EventLog
from proxy.exchange import Exchange
from proxy.messages import Message
from proxy.metrics import GUARDS, Metrics
from proxy.model_catalog import ModelCatalog
from proxy.policies.spec import Policy
from proxy.store.base import Store
from proxy.store.state import MemoryState, StateStore

# Writes a summary of `messages` for the exchange's session; raises on failure or timeout.
Summarizer = Callable[[Exchange, list[Message]], Awaitable[str]]


@dataclass(slots=True)
class StageContext:
    store: Store
    catalog: ModelCatalog
    metrics: Metrics
    events: EventLog
    summarize: Summarizer
    state: StateStore = field(default_factory=MemoryState)  # what guards keep between turns


class Stage(Protocol):
    """A stage may also set `preserves_pairing = True` when it only ever rewrites contents
    (keeping every role, tool_call_id and tool call id in place); the chain then skips the
    pairing check after it. Its tests must prove that."""

    name: str

    def enabled(self, policy: Policy) -> bool: ...

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None: ...


def record(ex: Exchange, ctx: StageContext, stage: str, action: str, **fields: Any) -> None:
    """Make a rewrite visible: a note for the headers, a metric, and an event log line."""
    ex.note(stage, action, **fields)
    metrics = ctx.metrics
    counter = metrics.decisions if stage in GUARDS else metrics.rewrites
    metrics.child(counter, stage, action).inc()
    before, after = fields.get("tokens_before"), fields.get("tokens_after")
    if isinstance(before, int) and isinstance(after, int) and before > after:
        metrics.child(metrics.tokens_saved, stage).inc(before - after)
        ex.tokens_saved += before - after
    ctx.events.write(ex, stage, action, fields)
