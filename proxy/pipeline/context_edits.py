"""The client's own context edits, carried out by the proxy where the deployment does not serve
them natively (a translated request): a client's instruction works for every model.

    ClearToolUses  past the trigger, the oldest tool results (and, if asked, their calls'
                   inputs) become a short placeholder with an archive reference, the most
                   recent `keep` tool uses and excluded tools left as they are; nothing when
                   less than `clear_at_least` tokens would go.
    Compact        past the trigger, the whole history is archived and summarized by the
                   proxy's summarizer; the request goes with the summary as its history, and
                   the client gets the summary back (its wire's compaction block) to send as
                   the history's new start from then on.

A deployment that serves the client's wire gets the client's instructions as sent (its wire
passes them on); this stage then does nothing. Deterministic: the same history and
instructions give the same bytes every turn (placeholders are pure functions of their content;
a compaction's summary is kept by the archived history's reference). What leaves the context is
archived first (proxy/pipeline/archive.py), so recall reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import LRUCache

from proxy.exchange import AppliedEdit, ClearToolUses, Compact, Exchange
from proxy.messages import (
    CHARS_PER_TOKEN,
    Message,
    call_input,
    call_name,
    estimate_tokens,
    takes_json,
    with_call_input,
)
from proxy.pipeline.archive import Entry, entry
from proxy.pipeline.base import StageContext, forget_sessions, record
from proxy.pipeline.compaction.artifacts import EMPTY
from proxy.pipeline.compaction.budget import schema_tokens, tokens_of
from proxy.pipeline.compaction.summarize import history_entry, ledger_room
from proxy.pipeline.offload import ARCHIVE_PATH, RECALL_TOOL
from proxy.policies.spec import Policy

STAGE = "context_edits"
REPLACEMENT_MARK = "[agentproxy] "
COMPACTION_HEADER = (
    REPLACEMENT_MARK + "Summary of the conversation before this point (the client's compaction):"
)
SUMMARY_ROOM = (1024, 8192)  # tokens a compaction's summary may take: at least, at most
SUMMARIES_BYTES = 4 * 1024 * 1024


def compaction_text(summary: str) -> str:
    """A compaction's summary as the text of the message that starts the history: the same
    text whether the proxy just wrote it or the client sends it back."""
    return f"{COMPACTION_HEADER}\n\n{summary}"


@dataclass(frozen=True, slots=True)
class _Use:
    """One tool call of the history and where its result is."""

    call: int  # index of the assistant message
    position: int  # of the call in its tool_calls
    result: int | None  # index of its tool message
    call_id: str
    name: str


class ContextEditStage:
    name = STAGE

    def __init__(self, summaries_bytes: int = SUMMARIES_BYTES) -> None:
        # A compaction's summary by (session, archived history's ref): the same history
        # compacts to the same bytes when the client sends it again.
        self._summaries: LRUCache[tuple[str, str], str] = LRUCache(
            summaries_bytes, getsizeof=lambda text: len(text) + 128
        )

    def memos(self) -> dict[str, LRUCache[Any, Any]]:
        return {"client_compactions": self._summaries}

    def forget(self, sessions: set[str]) -> None:
        forget_sessions(sessions, led=[self._summaries])

    def enabled(self, policy: Policy) -> bool:
        return True  # the client's instruction, not a policy's

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        context = ex.client.context
        if context is None or not context.edits or not ex.translated:
            return None  # nothing asked, or the deployment does it itself
        context.applied = [e for e in context.applied if e.edit == "clear_thinking"]
        out = messages
        for edit in context.edits:
            if isinstance(edit, ClearToolUses):
                out = await self._clear_tool_uses(ex, ctx, out, edit)
            elif isinstance(edit, Compact):
                out = await self._compact(ex, ctx, out, edit)
        return out if out is not messages else None

    # --- clear_tool_uses --------------------------------------------------------------------

    async def _clear_tool_uses(
        self, ex: Exchange, ctx: StageContext, messages: list[Message], edit: ClearToolUses
    ) -> list[Message]:
        uses = _tool_uses(messages)
        kind, value = edit.trigger
        measured = len(uses) if kind == "tool_uses" else _input_tokens(ex, messages)
        if measured <= value:
            return messages
        older = uses[: max(0, len(uses) - edit.keep)]
        chosen = [u for u in older if u.name not in edit.exclude_tools]
        entries: list[tuple[_Use, Entry | None, Entry | None]] = []
        for use in chosen:
            result = None
            if use.result is not None:
                content = messages[use.result].get("content")
                if not _cleared(content):
                    result = entry(ex, "tool_result", _data(content), tool=use.name,
                                   tool_call_id=use.call_id)  # fmt: skip
            arguments = None
            if _clears_input(edit, use.name):
                raw = _arguments(messages[use.call], use.position)
                if raw and not _cleared(raw):
                    arguments = entry(ex, "tool_arguments", raw.encode(), tool=use.name,
                                      tool_call_id=use.call_id)  # fmt: skip
            if result is not None or arguments is not None:
                entries.append((use, result, arguments))
        if not entries:
            return messages
        # Estimated first: clear_at_least asks for this much or nothing.
        out = list(messages)
        recall = ex.policy.recall.enabled
        for use, result, arguments in entries:
            if result is not None:
                at = use.result
                assert at is not None
                out[at] = _placeholder_result(out[at], use, result.ref, recall)
            if arguments is not None:
                out[use.call] = _without_input(out[use.call], use.position, arguments.ref)
        before = sum(estimate_tokens(messages[i]) for i in _touched(entries))
        after = sum(estimate_tokens(out[i]) for i in _touched(entries))
        if before - after < edit.clear_at_least:
            return messages
        archived = [e for _, r, a in entries for e in (r, a) if e is not None]
        stored = await ctx.archive.keep(ex, STAGE, archived)
        if len(stored) < len({e.ref for e in archived}):
            return messages  # nothing leaves the context unless it is stored
        tokens = max(0, before - after)
        cleared = sum(1 for _, r, _ in entries if r is not None) or len(entries)
        record(
            ex, ctx, STAGE, "cleared_tool_uses", count=cleared, tokens_before=before,
            tokens_after=after, refs=sorted({e.ref for e in archived}),
        )  # fmt: skip
        _count(ctx, "clear_tool_uses")
        _applied(ex, AppliedEdit("clear_tool_uses", cleared, tokens))
        return out

    # --- compact ------------------------------------------------------------------------------

    async def _compact(
        self, ex: Exchange, ctx: StageContext, messages: list[Message], edit: Compact
    ) -> list[Message]:
        if _input_tokens(ex, messages) <= edit.trigger:
            return messages
        head = 0
        while head < len(messages) and messages[head].get("role") == "system":
            head += 1
        stretch = messages[head:]
        if not stretch:
            return messages
        archived = history_entry(ex, stretch, head, len(messages) - 1)
        key = (ex.identity.session, archived.ref)
        summary = self._summaries.get(key)
        if summary is None:
            if archived.ref not in await ctx.archive.keep(ex, STAGE, [archived]):
                return messages
            summary = await self._summarize(ex, ctx, stretch, edit)
            if summary is None:  # a failed compaction: reported, the history kept whole
                _applied(ex, AppliedEdit("compaction", 0, 0, None))
                return messages
            self._summaries[key] = summary
        replaced: Message = {"role": "user", "content": compaction_text(summary)}
        out = [*messages[:head], replaced]
        before, after = sum(map(estimate_tokens, stretch)), estimate_tokens(replaced)
        record(
            ex, ctx, STAGE, "compacted", messages=len(stretch), tokens_before=before,
            tokens_after=after, ref=archived.ref,
        )  # fmt: skip
        _count(ctx, "compaction")
        _applied(ex, AppliedEdit("compaction", len(stretch), max(0, before - after), summary))
        return out

    async def _summarize(
        self, ex: Exchange, ctx: StageContext, stretch: list[Message], edit: Compact
    ) -> str | None:
        low, high = SUMMARY_ROOM
        room = max(low, min(high, edit.trigger // 10))
        shown = stretch
        if edit.instructions:  # the client's own summarization instructions, read last
            note = f"[instructions for this summary] {edit.instructions}"
            shown = [*stretch, {"role": "user", "content": note}]
        ledger = EMPTY.extended(stretch)  # what the agent touched: named whatever it writes
        kept = ledger_room(ledger, room)
        try:
            summary = await ctx.summarize(ex, shown, room - kept)
        except Exception as exc:  # never fail the request because compaction failed
            record(ex, ctx, STAGE, "summarizer_failed", error=f"{type(exc).__name__}: {exc}")
            return None
        summary = summary.strip()
        if summary and kept:
            summary = ledger.merged_into(summary, int(kept * CHARS_PER_TOKEN))
        return summary or None


def _input_tokens(ex: Exchange, messages: list[Message]) -> int:
    """The prompt a trigger is measured against: the history as the client's wire reads it
    (from its last compaction on) and the tool schemas, estimated (the same history, the same
    count, every time)."""
    return tokens_of(messages) + schema_tokens(ex.body.get("tools"))


def _tool_uses(messages: list[Message]) -> list[_Use]:
    results = {m.get("tool_call_id"): i for i, m in enumerate(messages) if m.get("role") == "tool"}
    uses: list[_Use] = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        for position, call in enumerate(message.get("tool_calls") or ()):
            if not isinstance(call, dict):
                continue
            call_id = str(call.get("id") or "")
            name = call_name(call)
            uses.append(_Use(index, position, results.get(call_id), call_id, str(name or "")))
    return uses


def _clears_input(edit: ClearToolUses, name: str) -> bool:
    inputs = edit.clear_inputs
    return inputs if isinstance(inputs, bool) else name in inputs


def _data(content: Any) -> bytes:
    if isinstance(content, str):
        return content.encode()
    return orjson.dumps(content)


def _cleared(content: Any) -> bool:
    return isinstance(content, str) and content.startswith(REPLACEMENT_MARK)


def _arguments(message: Message, position: int) -> str | None:
    arguments = call_input((message.get("tool_calls") or [])[position])
    return arguments if isinstance(arguments, str) and arguments not in ("", "{}") else None


def _how(ref: str, recall: bool) -> str:
    if recall:
        return (
            f'To read it, call the {RECALL_TOOL} tool with {{"ref": "{ref}"}}; people can GET '
            f"{ARCHIVE_PATH}{ref}."
        )
    return f"People can read it with GET {ARCHIVE_PATH}{ref}."


def _placeholder_result(message: Message, use: _Use, ref: str, recall: bool) -> Message:
    """The tool message with its result replaced by a placeholder (pure: same inputs, same
    bytes)."""
    text = (
        f"{REPLACEMENT_MARK}This tool result was cleared from the context (context editing).\n"
        f"tool: {use.name}   call: {use.call_id}   reference: {ref}\n{_how(ref, recall)}"
    )
    return {**message, "content": text}


def _without_input(message: Message, position: int, ref: str) -> Message:
    calls = list(message.get("tool_calls") or [])
    call = calls[position]
    note = f"{REPLACEMENT_MARK}input cleared from the context (context editing); reference {ref}"
    # A custom tool's input is free text: the note as it is; a function's stays JSON.
    arguments = orjson.dumps({"cleared": note}).decode() if takes_json(call) else note
    calls[position] = with_call_input(call, arguments)
    return {**message, "tool_calls": calls}


def _touched(entries: list[tuple[_Use, Entry | None, Entry | None]]) -> set[int]:
    touched: set[int] = set()
    for use, result, arguments in entries:
        if result is not None and use.result is not None:
            touched.add(use.result)
        if arguments is not None:
            touched.add(use.call)
    return touched


def _count(ctx: StageContext, edit: str) -> None:
    ctx.metrics.child(ctx.metrics.context_edits, edit, "client").inc()


def _applied(ex: Exchange, applied: AppliedEdit) -> None:
    if ex.client.context is not None:
        ex.client.context.applied.append(applied)
