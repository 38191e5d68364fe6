"""Store before removal: the one writer of what leaves a request's context.

Offload (tool results), repair (results set aside), truncation (old tool arguments) and
summarization (stretches of history) hand what they are about to remove to `Archive.keep`
first. References are content-addressed within the exchange's scoped session, so the same
content always gets the same ref (pointers stay prefix-stable across turns and restarts),
and every blob belongs to the exchange's owner.

One failure policy: content whose write failed must stay in the context (`keep` returns only
the refs now stored; the caller removes nothing else), and the failure is recorded through the
recorder once per batch, `<stage>.store_failed` with the count and the store's error, then
counted, logged and reported like any other rewrite.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.exchange import Exchange
from proxy.logs.limit import warn_limited
from proxy.recording.recorder import Recorder
from proxy.store.base import BlobInfo, Store, content_ref

log = logging.getLogger("agentproxy.archive")


@dataclass(frozen=True, slots=True)
class Entry:
    """Content about to leave a context, under the ref a pointer to it names."""

    ref: str
    kind: str  # "tool_result", "set_aside", "tool_arguments", "history"
    data: bytes
    meta: dict[str, Any] = field(default_factory=dict)  # tool, call id, message count...


def ref_of(ex: Exchange, kind: str, data: bytes) -> str:
    """The reference `data` gets in this exchange's session: the same bytes, the same ref."""
    return content_ref(ex.identity.session, kind, data)


def entry(ex: Exchange, kind: str, data: bytes, **meta: Any) -> Entry:
    return Entry(ref_of(ex, kind, data), kind, data, meta)


class Archive:
    def __init__(self, store: Store, recorder: Recorder) -> None:
        self.store = store
        self.recorder = recorder

    async def keep(self, ex: Exchange, stage: str, entries: Sequence[Entry]) -> set[str]:
        """Write `entries` durably (concurrently); the refs that are now stored. Whatever is
        not among them stays in the context."""
        unique = {e.ref: e for e in entries}  # the same content twice is written once
        if not unique:
            return set()
        now = time.time()
        outcomes = await asyncio.gather(
            *(self._put(ex, e, now) for e in unique.values()), return_exceptions=True
        )
        kept: set[str] = set()
        errors: list[str] = []
        for ref, outcome in zip(unique, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                kept.add(ref)
            elif isinstance(outcome, Exception):
                errors.append(f"{type(outcome).__name__}: {outcome}")
            else:
                raise outcome  # cancelled: the request is gone, nothing to decide
        if errors:
            warn_limited(
                log,
                "archive.write",
                "%s: %d archive write(s) failed in session %s, content kept: %s",
                stage, len(errors), ex.identity.session, errors[0],
            )  # fmt: skip
            self.recorder.record(ex, stage, "store_failed", count=len(errors), error=errors[0])
        return kept

    async def _put(self, ex: Exchange, entry: Entry, now: float) -> None:
        info = BlobInfo(
            entry.ref,
            ex.identity.session,
            entry.kind,
            len(entry.data),
            now,
            ex.identity.owner,
            entry.meta,
        )
        await self.store.put(info, entry.data)
