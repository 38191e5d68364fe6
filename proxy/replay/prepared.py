"""Summaries the proxy wrote ahead of a compaction trigger (proxy/pipeline/compaction/
prepared.py), as a replay counts them: from the replayed app's own
agentproxy_compaction_prepared_total, read after each turn and once more when the app has
stopped (a summary it still held then was never used: wasted).

A summary is written in the background, so the turn it is counted on is the one during which
the proxy started, used or dropped it; the totals are exact."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from proxy.metrics import Metrics


@dataclass(frozen=True, slots=True)
class PreparedCount:
    prepared: int = 0  # started ahead of the trigger
    used: int = 0  # taken by the turn that crossed it
    wasted: int = 0  # written (or being written) but never used


class PreparedWatch:
    """The counts since the last look, for one replayed app."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.seen = self._read()

    def _read(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for family in self.metrics.compaction_prepared.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["result"]] = int(sample.value)
        return counts

    def since(self) -> PreparedCount:
        now = self._read()
        new, self.seen = now - self.seen, now
        return PreparedCount(new["started"], new["used"], new["wasted"])
