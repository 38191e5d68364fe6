"""OpenAI compaction for every deployment: what the client asks of it, carried out.

Three ways a Responses client asks (OpenAI's context-management guide):

- `POST /v1/responses/compact` (the whole window in, a compacted window out: its user
  messages, then one `compaction` item);
- `context_management: [{"type": "compaction", "compact_threshold": N}]` on a create: past N
  input tokens the window is compacted first, the answer's output then starts with the item;
- Codex (0.171, its built-in `openai` provider) ends a create's input with a
  `{"type": "compaction_trigger"}` item and reads back exactly one `compaction` output item.

A deployment that serves Responses natively (OpenAI's) gets each as sent: the provider does
it. For any other the proxy does it with its own summarizer (proxy/pipeline/compaction/:
the stretch archived first, the summary written, stored and named by a minted item,
compaction_items.py), counted as agentproxy_context_edits_total{edit="compaction",
source="client"}.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from proxy.errors import ProxyError, ServiceUnavailable, UpstreamBadResponse
from proxy.exchange import Exchange, Usage
from proxy.messages import Message
from proxy.pipeline.base import StageContext, record
from proxy.pipeline.compaction.artifacts import EMPTY
from proxy.pipeline.compaction.summarize import history_entry, ledger_room, summary_message
from proxy.pipeline.compaction.summarizer import SUMMARY_MAX_TOKENS
from proxy.store.base import StoreError
from proxy.wire.responses.compaction_items import mint

STAGE = "compaction"
TRIGGER = "compaction_trigger"  # Codex's input item asking for a compaction
SUMMARY_WINDOW_SHARE = 0.2


def is_triggered(body: dict[str, Any]) -> bool:
    """The input ends with Codex's `compaction_trigger` item."""
    items = body.get("input")
    last = items[-1] if isinstance(items, list) and items else None
    return isinstance(last, dict) and last.get("type") == TRIGGER


async def compact(
    ex: Exchange, ctx: StageContext, messages: list[Message]
) -> tuple[dict[str, Any], str]:
    """The `compaction` item standing for `messages` (system messages aside) and its summary
    message's text: the stretch is
    archived, summarized by the policy's summarizer, the summary stored; a failure is the
    client's error answer (the client asked for this compaction: no silent fallback)."""
    stretch = [m for m in messages if m.get("role") != "system"]
    archived = history_entry(ex, stretch, 0, max(0, len(stretch) - 1))
    try:
        if archived.ref not in await ctx.archive.keep(ex, STAGE, [archived]):
            raise StoreError("the history to compact could not be archived")
        room = summary_room(ex)
        ledger = EMPTY.extended(stretch)  # what the agent touched: named whatever it writes
        summary = await asyncio.wait_for(
            ctx.summarize(ex, stretch, room - ledger_room(ledger, room)),
            ex.policy.compaction.summarizer_timeout_s,
        )
        if not summary.strip():
            raise ValueError("the summarizer returned an empty summary")
        recall = ex.policy.recall.enabled
        text = summary_message(summary, len(stretch), archived.ref, room, recall, ledger)["content"]
        item = await mint(ex, ctx.archive, text, history=archived.ref, messages=len(stretch))
    except StoreError as exc:
        raise ServiceUnavailable(
            f"the compaction could not be stored: {exc}", code="store_unavailable"
        ) from None
    except ProxyError:
        raise
    except Exception as exc:  # the summarizer's failure: say so, in the client's shape
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        record(ex, ctx, STAGE, "summarizer_failed", error=error)
        message = f"the compaction's summary could not be written ({error})"
        raise UpstreamBadResponse(message) from exc
    record(ex, ctx, STAGE, "client_compacted", messages=len(stretch), ref=archived.ref)
    ctx.metrics.child(ctx.metrics.context_edits, "compaction", "client").inc()
    return item, text


def summary_room(ex: Exchange) -> int:
    """Tokens the summary may take: at most a fifth of the window, at most the summarizer's
    longest."""
    window = ex.deployment.max_input_tokens if ex.deployment else None
    if not window:
        return SUMMARY_MAX_TOKENS
    return max(64, min(SUMMARY_MAX_TOKENS, int(SUMMARY_WINDOW_SHARE * window)))


def usage_body(usage: Usage | None) -> dict[str, Any]:
    """A Responses usage object."""
    prompt = usage.prompt_tokens if usage else 0
    output = usage.completion_tokens if usage else 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": (usage.cache_read if usage else 0) or 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def side_usage(ex: Exchange) -> Usage | None:
    """What the proxy's own calls for this request (its summaries) used."""
    total: Usage | None = None
    for side in ex.accounting.side_calls:
        total = total or Usage()
        total.add(side.usage)
    return total


def compacted_window(
    ex: Exchange, items: list[Any], item: dict[str, Any], request_id: str
) -> dict[str, Any]:
    """The answer of POST /v1/responses/compact: the input's user messages, then the item."""
    users = [
        {"type": "message", **i, "content": _parts(i.get("content"))}
        for i in items
        if isinstance(i, dict) and i.get("type", "message") == "message" and i.get("role") == "user"
    ]
    return {
        "id": f"resp_{request_id}",
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [*users, item],
        "usage": usage_body(side_usage(ex)),
    }


def compaction_response(ex: Exchange, item: dict[str, Any], request_id: str) -> dict[str, Any]:
    """A create's answer to Codex's compaction_trigger: one compaction output item."""
    return {
        "id": f"resp_{request_id}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": ex.alias,
        "output": [item],
        "usage": usage_body(side_usage(ex)),
    }


def _parts(content: Any) -> Any:
    """A message's text as input_text parts (how an output item carries a user message)."""
    return [{"type": "input_text", "text": content}] if isinstance(content, str) else content
