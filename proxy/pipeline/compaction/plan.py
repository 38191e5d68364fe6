"""The output of one fitting under construction: head + inserted + tail.

Token figures come from the per-message estimates of this turn's history (memo.Seen),
so re-checking the total after each step costs a C-level sum, not a pass over the messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.messages import Message
from proxy.pipeline.compaction.artifacts import EMPTY, ArtifactLedger
from proxy.pipeline.compaction.budget import tokens_of
from proxy.pipeline.compaction.memo import Seen


@dataclass(slots=True)
class Plan:
    """The output under construction: head + inserted + tail, where tail = messages[base:]
    with old writing-tool arguments truncated."""

    seen: Seen  # this turn's history, with per-message token estimates
    head: int  # leading system/developer prompts
    fixed: int  # tool schema tokens
    inserted: list[Message] = field(default_factory=list)
    base: int = 0
    tail: list[Message] = field(default_factory=list)
    saved: dict[int, int] = field(default_factory=dict)  # message index → tokens truncation saved
    changed: bool = False
    ledger: ArtifactLedger = EMPTY  # what messages[:base] touched (the checkpoint's)

    def tokens(self) -> int:
        costs = self.seen.costs
        kept = sum(costs[: self.head]) + sum(costs[self.base :]) + tokens_of(self.inserted)
        return self.fixed + kept - sum(t for i, t in self.saved.items() if i >= self.base)

    def rebase(self, cut: int, inserted: list[Message], ledger: ArtifactLedger) -> None:
        """messages[head:cut] are now represented by `inserted`; `ledger`: what they touched."""
        self.tail = self.tail[cut - self.base :]
        self.base, self.inserted, self.changed = cut, inserted, True
        self.ledger = ledger

    def ledger_to(self, cut: int) -> ArtifactLedger:
        """What messages[:cut] touched: the ledger so far and the raw stretch's tool calls."""
        return self.ledger.extended(self.seen.messages[self.base : cut])

    def output(self) -> list[Message] | None:
        if not self.changed:
            return None
        return [*self.seen.messages[: self.head], *self.inserted, *self.tail]
