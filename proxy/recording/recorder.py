"""The one seam through which every rewrite, decision and failure becomes visible: a note for
the `x-agentproxy-applied` header, a counter, and a line in the event log, always together."""

from __future__ import annotations

from typing import Any

from proxy.exchange import Exchange
from proxy.metrics import GUARDS, Metrics
from proxy.recording.events import EventLog

# Stages whose events have metrics of their own, with richer labels (retries by model and
# class, fallbacks by source and target, upstream errors by reason): not counted again here.
COUNTED_ELSEWHERE = frozenset({"retry", "fallback", "circuit", "stream", "usage"})


class Recorder:
    def __init__(self, metrics: Metrics, events: EventLog) -> None:
        self.metrics = metrics
        self.events = events

    def record(self, ex: Exchange, stage: str, action: str, **fields: Any) -> None:
        ex.note(stage, action, **fields)
        metrics = self.metrics
        if stage not in COUNTED_ELSEWHERE:
            counter = metrics.decisions if stage in GUARDS else metrics.rewrites
            metrics.child(counter, stage, action).inc()
        before, after = fields.get("tokens_before"), fields.get("tokens_after")
        if isinstance(before, int) and isinstance(after, int) and before > after:
            metrics.child(metrics.tokens_saved, stage).inc(before - after)
            ex.rewrite.tokens_saved += before - after
        self.events.write(ex, stage, action, fields)
