"""Steps b and d of fitting: archive a stretch of history, then replace it with the session's
intent (intent.py) and a summary or, when the summarizer fails or its summary lacks the
required sections, a marker (middle-out).

The replacement messages are `user` messages: every provider accepts one right after the
system prompt, and none accepts a second system message there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import orjson

from proxy import messages as msgs
from proxy.exchange import Exchange
from proxy.messages import Message
from proxy.pipeline.archive import Entry, entry
from proxy.pipeline.base import StageContext, record
from proxy.pipeline.compaction.artifacts import EMPTY, ArtifactLedger
from proxy.pipeline.compaction.budget import tokens_of
from proxy.pipeline.compaction.sections import missing_sections

STAGE = "compaction"
KIND = "history"
SUMMARY_HEADER = (
    "[agentproxy] Earlier conversation summarized ({count} messages archived as {ref}{how})."
)
SUMMARY_HOW = "; call agentproxy_recall with that ref to read them"
MIDDLE_OUT = (
    "[agentproxy] {count} messages (~{tokens} tokens) were cut from the middle to fit the "
    "context window; they are archived as {ref}{how}."
)
MIDDLE_OUT_HOW = " (agentproxy_recall can read them)"
# A summary may use at most this share of the window, and what is left under the target
# otherwise, so a wordy summarizer cannot push the history straight back over the trigger.
SUMMARY_WINDOW_SHARE = 0.2
MIN_SUMMARY_TOKENS = 64
MIN_SUMMARY_CHARS = 256
# The share of a summary's room kept for the ledger of touched files (what the summarizer is
# asked for is the rest), and its characters at most.
LEDGER_ROOM_SHARE = 0.25
MAX_LEDGER_CHARS = 8_000


def history_entry(ex: Exchange, stretch: Sequence[Message], first: int, last: int) -> Entry:
    """The raw messages about to leave the context, for the archive. Content-addressed over
    their canonical JSON, so the same stretch archives once."""
    data = orjson.dumps(list(stretch), option=orjson.OPT_SORT_KEYS)
    meta = {"messages": len(stretch), "first": first, "last": last, "tokens": tokens_of(stretch)}
    return entry(ex, KIND, data, **meta)


def summary_message(
    summary: str,
    count: int,
    ref: str,
    max_tokens: int,
    recall: bool,
    ledger: ArtifactLedger = EMPTY,
) -> Message:
    """The summary as a message: a header with its archive reference, then the text, cut at
    `max_tokens` (the room it has in the window) should the summarizer have overrun it, with
    what the ledger knows that its ARTIFACTS section does not name (artifacts.py), in the
    part of that room kept for it."""
    kept = ledger_room(ledger, max_tokens)
    limit = max(MIN_SUMMARY_CHARS, int((max_tokens - kept) * msgs.CHARS_PER_TOKEN))
    text = summary.strip()
    if len(text) > limit:
        text = text[:limit] + " …"
    if kept:
        text = ledger.merged_into(text, int(kept * msgs.CHARS_PER_TOKEN))
    how = SUMMARY_HOW if recall else ""
    header = SUMMARY_HEADER.format(count=count, ref=ref, how=how)
    return {"role": "user", "content": f"{header}\n\n{text}"}


def ledger_room(ledger: ArtifactLedger, room: int) -> int:
    """Tokens of a summary's `room` kept for the ledger's lines: what they would all take, at
    most LEDGER_ROOM_SHARE of the room (the summarizer is asked for the rest)."""
    if not ledger:
        return 0
    chars = min(MAX_LEDGER_CHARS, ledger.chars())
    return min(int(room * LEDGER_ROOM_SHARE), int(chars / msgs.CHARS_PER_TOKEN) + 1)


def summary_room(window: int, target: int, kept: int, intent: int) -> int:
    """Tokens a summary may take: what is left under the target once the kept part and the
    intent are counted, within [MIN_SUMMARY_TOKENS, SUMMARY_WINDOW_SHARE of the window]."""
    return max(MIN_SUMMARY_TOKENS, min(int(SUMMARY_WINDOW_SHARE * window), target - kept - intent))


def middle_out(
    intent: Sequence[Message], stretch: Sequence[Message], ref: str, recall: bool
) -> list[Message]:
    """What replaces the stretch without a summary: the intent, and a marker."""
    cut = [m for m in stretch if not any(m is i for i in intent)]
    how = MIDDLE_OUT_HOW if recall else ""
    text = MIDDLE_OUT.format(count=len(cut), tokens=tokens_of(cut), ref=ref, how=how)
    return [*intent, {"role": "user", "content": text}]


async def replace_stretch(
    ex: Exchange,
    ctx: StageContext,
    intent: list[Message],
    stretch: list[Message],
    ref: str,
    room: int,
    ledger: ArtifactLedger = EMPTY,
) -> tuple[list[Message], str]:
    """`[*intent, summary]` for an archived stretch, or `[*intent, marker]` (middle-out) when
    the summarizer fails, is too slow or answers without the required sections; the kind
    ("summary" or "middle_out") comes with it. `room`: the tokens the summary may take;
    `ledger`: what the session's tool calls touched up to the stretch's end."""
    spec = ex.policy.compaction
    started = time.perf_counter()
    try:
        asked = room - ledger_room(ledger, room)
        summary = await asyncio.wait_for(
            ctx.summarize(ex, stretch, asked), spec.summarizer_timeout_s
        )
        if not summary.strip():
            raise ValueError("the summarizer returned an empty summary")
    except Exception as exc:  # never fail the request because compaction failed
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        waited = round(time.perf_counter() - started, 3)
        record(ex, ctx, STAGE, "summarizer_failed", error=error, seconds=waited)
        return middle_out(intent, stretch, ref, ex.policy.recall.enabled), "middle_out"
    return summary_replacement(ex, ctx, intent, stretch, ref, room, summary, ledger)


def summary_replacement(
    ex: Exchange,
    ctx: StageContext,
    intent: list[Message],
    stretch: list[Message],
    ref: str,
    room: int,
    summary: str,
    ledger: ArtifactLedger = EMPTY,
) -> tuple[list[Message], str]:
    """What replaces the stretch given the summarizer's answer: the intent and the summary,
    or the intent and a marker when the summary lacks its sections; and which it is."""
    recall = ex.policy.recall.enabled
    missing = missing_sections(summary)
    if missing:  # a summary that lost its structure has likely lost the task too
        record(ex, ctx, STAGE, "summary_rejected", missing=missing, chars=len(summary))
        return middle_out(intent, stretch, ref, recall), "middle_out"
    message = summary_message(summary, len(stretch), ref, room, recall, ledger)
    return [*intent, message], "summary"
