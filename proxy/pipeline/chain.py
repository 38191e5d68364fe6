"""Runs the rewrite stages in order over one exchange, and keeps every law while doing it.

Fail-safe: a stage that crashes, or returns a history that breaks the provider's pairing rules,
is skipped — the request goes on with the messages from before that stage, and the event is
recorded. (A stage raising a ProxyError means it: a guard refusing the request.) Dry-run: every
stage runs and reports, but the original messages are sent.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from cachetools import LRUCache

from proxy.errors import ProxyError
from proxy.exchange import Exchange, Usage
from proxy.messages import Message, pairing_problems, tool_call_ids
from proxy.pipeline.base import Stage, StageContext, forget_sessions, record
from proxy.sessions.history_memo import HistoryMemo, Seen

log = logging.getLogger("agentproxy.pipeline")


class Chain:
    """The stages in order; each named hook (pipeline/base.py: Hooks) is called on the stages
    that implement it, in the same order."""

    def __init__(self, stages: Sequence[Stage], memo_bytes: int = 128 * 1024 * 1024) -> None:
        self.stages = tuple(stages)
        # Each session's last input, bounded by the request bytes held (the lineage reads it).
        self.histories = HistoryMemo(memo_bytes)
        self._hooked = {name: _having(self.stages, name) for name in HOOKS}

    def memos(self) -> dict[str, LRUCache[Any, Any]]:
        memos = {"histories": self.histories.cache}
        for stage in self._hooked["memos"]:
            memos.update(stage.memos())
        return memos

    def forget(self, sessions: set[str]) -> None:
        forget_sessions(sessions, named=[self.histories.cache])
        for stage in self._hooked["forget"]:
            stage.forget(sessions)

    async def after_overflow(self, ex: Exchange, ctx: StageContext) -> list[Message] | None:
        """The first history an enabled stage offers to retry an overflowed request with."""
        for stage in self._hooked["after_overflow"]:
            if stage.enabled(ex.policy):
                compacted: list[Message] | None = await stage.after_overflow(ex, ex.messages, ctx)
                if compacted is not None:
                    return compacted
        return None

    def accepted(self, ex: Exchange) -> None:
        for stage in self._hooked["accepted"]:
            if stage.enabled(ex.policy):
                stage.accepted(ex)

    async def after_call(
        self, ex: Exchange, ctx: StageContext, usage: Usage | None, cost: float | None, calls: int
    ) -> None:
        for stage in self._hooked["after_call"]:
            if stage.enabled(ex.policy):
                await stage.after_call(ex, ctx, usage, cost, calls)

    async def rewrite(self, ex: Exchange, ctx: StageContext) -> list[Message]:
        """The messages to send upstream (also stored in ex.body unless dry-run)."""
        original: list[Message] = ex.messages
        ex.rewrite.stable_prefix = self._stable_prefix(ex, original)
        messages = original
        for stage in self.stages:
            if ex.client.opaque_history and not getattr(stage, "guard", False):
                continue  # the history lives at the provider: only the guards run
            if stage.enabled(ex.policy):
                messages = await self._run(stage, ex, messages, ctx)
        if messages is not original and not ex.dry_run:
            ex.body["messages"] = messages
        return messages if not ex.dry_run else original

    def _stable_prefix(self, ex: Exchange, messages: list[Message]) -> int:
        """Turn N+1 is turn N plus new messages: one C-level `==` over the shared part tells
        every stage how much of the history it has already seen (the lineage's, when it made
        that very comparison for this request)."""
        rewrite = ex.rewrite
        entry = self.histories.get(ex.identity.session)
        last = entry.messages if entry is not None else None
        checked = rewrite.checked
        if checked is not None and checked.history is not messages:
            checked = None
        if last is None:
            shared = 0
        elif checked is not None and checked.seen is last:
            shared = len(last)
        else:
            shared = len(last) if last == messages[: len(last)] else 0
        size = ex.client.body_bytes or 64 * len(messages)  # factory-built exchanges have no body
        digest = checked.digest if checked is not None else None
        seen = Seen(size, list(messages), digest)
        rewrite.turn = seen.turn
        rewrite.stable_base = entry.turn if shared and entry is not None else None
        self.histories.remember(ex.identity.session, seen)
        return shared

    async def _run(
        self, stage: Stage, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message]:
        try:
            result = await stage.run(ex, messages, ctx)
        except ProxyError:
            raise  # a deliberate refusal (a guard said no), not a crash
        except Exception as exc:
            log.exception(
                "stage %s failed on request %s; skipped", stage.name, ex.identity.request_id
            )
            record(ex, ctx, stage.name, "stage_failed", error=f"{type(exc).__name__}: {exc}")
            return messages
        if result is None or result is messages:
            return messages
        if getattr(stage, "preserves_pairing", False) or _same_outline(messages, result):
            return result  # only contents changed: pairing is exactly as it was before
        problems = pairing_problems(result)
        if problems:
            record(ex, ctx, stage.name, "rejected_invalid", problems=[str(p) for p in problems[:5]])
            return messages
        return result


HOOKS = ("after_overflow", "accepted", "after_call", "memos", "forget")


def _having(stages: tuple[Stage, ...], hook: str) -> tuple[Any, ...]:
    """The stages that implement `hook`, in order (found once, not per request)."""
    return tuple(stage for stage in stages if callable(getattr(stage, hook, None)))


def _same_outline(before: list[Message], after: list[Message]) -> bool:
    """True when `after` has the same roles and tool-call ids at every position: a stage that
    only rewrote contents (offload, truncation) cannot have broken the pairing rules. Cheap:
    unchanged positions are the very same dicts."""
    if len(before) != len(after):
        return False
    for old, new in zip(before, after, strict=True):
        if old is not new and (
            old.get("role") != new.get("role")
            or old.get("tool_call_id") != new.get("tool_call_id")
            or tool_call_ids(old) != tool_call_ids(new)
        ):
            return False
    return True
