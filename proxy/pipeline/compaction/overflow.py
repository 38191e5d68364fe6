"""Reactive compaction: the provider said the context overflowed although our estimate fit.

The caller (the request path) retries once with what `compact_after_overflow` returns. The
session remembers the size that overflowed as its window from then on, so later turns compact
before reaching it instead of failing the same way every turn; and an overflow that would be
answered with exactly the recovery already tried gets None, so the caller passes the error
through instead of looping.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Protocol

import orjson
import xxhash

from proxy.exchange import Exchange
from proxy.messages import Message
from proxy.pipeline.base import StageContext, record
from proxy.pipeline.compaction.budget import tokens_of
from proxy.pipeline.compaction.summarize import STAGE


class Compactor(Protocol):
    """What reactive compaction needs of the compaction stage (which calls in here from its
    on-overflow hook): compacting to a fraction, and the recovery last sent per session."""

    @property
    def recoveries(self) -> MutableMapping[str, int]: ...

    async def compact_to(
        self, ex: Exchange, messages: list[Message], ctx: StageContext, fraction: float
    ) -> list[Message] | None: ...


async def compact_after_overflow(
    ex: Exchange, messages: list[Message], ctx: StageContext, stage: Compactor
) -> list[Message] | None:
    """The history to retry with, compacted to `reactive_target` of what overflowed (or of
    the window, if that is smaller); None when there is nothing smaller to try (the caller
    then passes the provider's error through).

    `messages` is what was sent: the compaction stage's own output is recognised and mapped
    back to the agent's history, so checkpoints keep matching on later turns."""
    spec = ex.policy.compaction
    if not (spec.enabled and spec.reactive):
        return None
    compacted = await stage.compact_to(ex, messages, ctx, spec.reactive_target)
    if compacted is None or tokens_of(compacted) >= tokens_of(messages):  # nothing smaller
        record(ex, ctx, STAGE, "overflow_unrecoverable", tokens_before=tokens_of(messages))
        return None
    signature = xxhash.xxh3_64_intdigest(orjson.dumps(compacted))
    if stage.recoveries.get(ex.identity.session) == signature:
        record(ex, ctx, STAGE, "overflow_repeated", tokens_after=tokens_of(compacted))
        return None  # this exact recovery was already sent once
    stage.recoveries[ex.identity.session] = signature
    record(
        ex, ctx, STAGE, "overflow_compacted", tokens_before=tokens_of(messages),
        tokens_after=tokens_of(compacted), messages=len(compacted),
    )  # fmt: skip
    return compacted
