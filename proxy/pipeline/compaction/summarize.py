"""Steps b and d of fitting: archive a stretch of history, then replace it with a summary
or, when the summarizer fails, with a marker (middle-out).

The replacement messages are `user` messages: every provider accepts one right after the
system prompt, and none accepts a second system message there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import orjson

from proxy.exchange import Exchange
from proxy.messages import Message
from proxy.pipeline.archive import Entry, entry
from proxy.pipeline.base import StageContext, record
from proxy.pipeline.compaction.budget import tokens_of

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
# A summary may use at most this share of the window (in chars at 4 per token), so a wordy
# summarizer cannot push the history straight back over the trigger.
SUMMARY_WINDOW_SHARE = 0.2
MIN_SUMMARY_CHARS = 1_000


def history_entry(ex: Exchange, stretch: Sequence[Message], first: int, last: int) -> Entry:
    """The raw messages about to leave the context, for the archive. Content-addressed over
    their canonical JSON, so the same stretch archives once."""
    data = orjson.dumps(list(stretch), option=orjson.OPT_SORT_KEYS)
    meta = {"messages": len(stretch), "first": first, "last": last, "tokens": tokens_of(stretch)}
    return entry(ex, KIND, data, **meta)


def summary_message(summary: str, count: int, ref: str, window: int, recall: bool) -> Message:
    limit = max(MIN_SUMMARY_CHARS, int(window * SUMMARY_WINDOW_SHARE * 4))
    text = summary.strip()
    if len(text) > limit:
        text = text[:limit] + " …"
    how = SUMMARY_HOW if recall else ""
    header = SUMMARY_HEADER.format(count=count, ref=ref, how=how)
    return {"role": "user", "content": f"{header}\n\n{text}"}


def middle_out(
    previous: Sequence[Message], stretch: Sequence[Message], ref: str, recall: bool
) -> list[Message]:
    """What replaces the stretch without a summarizer: the message carrying the user's goal
    (the earlier replacement's first message, else the first user message), and a marker."""
    anchor: Message | None = previous[0] if previous else None
    if anchor is None:
        anchor = next((m for m in stretch if m.get("role") == "user"), None)
    cut = [m for m in stretch if m is not anchor]
    how = MIDDLE_OUT_HOW if recall else ""
    text = MIDDLE_OUT.format(count=len(cut), tokens=tokens_of(cut), ref=ref, how=how)
    marker: Message = {"role": "user", "content": text}
    return [anchor, marker] if anchor is not None else [marker]


async def replace_stretch(
    ex: Exchange,
    ctx: StageContext,
    previous: list[Message],
    stretch: list[Message],
    ref: str,
    window: int,
) -> tuple[list[Message], str]:
    """The summary of an archived stretch, or the middle-out marker when the summarizer fails
    or is too slow; the kind ("summary" or "middle_out") comes with it."""
    spec = ex.policy.compaction
    recall = ex.policy.recall.enabled
    started = time.perf_counter()
    try:
        summary = await asyncio.wait_for(ctx.summarize(ex, stretch), spec.summarizer_timeout_s)
        if not summary.strip():
            raise ValueError("the summarizer returned an empty summary")
    except Exception as exc:  # never fail the request because compaction failed
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        waited = round(time.perf_counter() - started, 3)
        record(ex, ctx, STAGE, "summarizer_failed", error=error, seconds=waited)
        return middle_out(previous, stretch, ref, recall), "middle_out"
    return [summary_message(summary, len(stretch), ref, window, recall)], "summary"
