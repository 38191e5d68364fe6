"""Anthropic's context management, as the simulated API serves it: `context_management.edits`
(clear_tool_uses_20250919, clear_thinking_20251015, compact_20260112) applied before the model
reads the prompt, each needing its beta header, and reported back in `applied_edits` (a
compaction as a `compaction` block opening the answer); a `compaction` block in the messages
drops everything before it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from .wire import ApiError

JSON = dict[str, Any]
BETAS = {
    "clear_tool_uses_20250919": "context-management-2025-06-27",
    "clear_thinking_20251015": "context-management-2025-06-27",
    "compact_20260112": "compact-2026-01-12",
}
PLACEHOLDER = "[cleared to save context]"
SUMMARY = "Summary of the {count} messages before this point (simulated compaction)."


@dataclass(slots=True)
class Applied:
    """What the edits did to one request."""

    edits: list[JSON] = field(default_factory=list)  # applied_edits, Anthropic's shape
    compaction: str | None = None  # a summary this request's compaction wrote
    requested: bool = False  # the request had context_management


def check(body: JSON, betas: list[str]) -> ApiError | None:
    """A context_management field without the betas its edits need is refused, as a field
    the API does not know."""
    raw = body.get("context_management")
    if raw is None:
        return None
    edits = raw.get("edits") if isinstance(raw, dict) else None
    if not isinstance(edits, list):
        return ApiError(400, "context_management.edits: Field required")
    for i, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind not in BETAS:
            return ApiError(400, f"context_management.edits.{i}.type: unknown edit {kind!r}")
        if BETAS[kind] not in betas:
            return ApiError(400, "context_management: Extra inputs are not permitted")
    return None


def after_compaction(messages: list[JSON]) -> list[JSON]:
    """The messages from the last compaction block on: the block read as a user message with
    its summary (blocks before it, and messages before its own, dropped)."""
    for index in range(len(messages) - 1, -1, -1):
        content = messages[index].get("content")
        if not isinstance(content, list):
            continue
        for at in range(len(content) - 1, -1, -1):
            block = content[at]
            if (
                isinstance(block, dict)
                and block.get("type") == "compaction"
                and isinstance(block.get("content"), str)
            ):
                summary = {"role": "user", "content": [{"type": "text", "text": block["content"]}]}
                rest = [b for b in content[at + 1 :] if isinstance(b, dict)]
                turn = [{**messages[index], "content": rest}] if rest else []
                return [summary, *turn, *messages[index + 1 :]]
    return messages


def apply(body: JSON, count: Callable[[JSON], int]) -> tuple[JSON, Applied]:
    """The body as the model reads it after the request's edits, and what they did. `count`:
    the prompt's tokens, as the simulator counts them."""
    applied = Applied()
    messages = after_compaction(body["messages"])
    raw = body.get("context_management")
    if isinstance(raw, dict):
        applied.requested = True
        tokens = count(body)
        for edit in raw.get("edits") or []:
            kind = edit.get("type")
            if kind == "clear_tool_uses_20250919":
                messages = _clear_tool_uses(messages, edit, tokens, applied)
            elif kind == "clear_thinking_20251015":
                messages = _clear_thinking(messages, edit, applied)
            elif kind == "compact_20260112":
                messages = _compact(messages, edit, tokens, applied)
    return {**body, "messages": messages}, applied


def _value(spec: Any, default: int) -> int:
    return int(spec["value"]) if isinstance(spec, Mapping) and "value" in spec else default


def _clear_tool_uses(messages: list[JSON], edit: JSON, tokens: int, applied: Applied) -> list[JSON]:
    uses = [
        (i, k, b)
        for i, m in enumerate(messages)
        if m.get("role") == "assistant" and isinstance(m.get("content"), list)
        for k, b in enumerate(m["content"])
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    trigger = edit.get("trigger") or {"type": "input_tokens", "value": 100_000}
    measured = len(uses) if trigger.get("type") == "tool_uses" else tokens
    if measured <= _value(trigger, 100_000):
        return messages
    keep = _value(edit.get("keep"), 3)
    exclude = set(edit.get("exclude_tools") or ())
    inputs = edit.get("clear_tool_inputs") or False
    older = [u for u in uses[: max(0, len(uses) - keep)] if u[2].get("name") not in exclude]
    cleared_ids = {b.get("id"): b.get("name") for _, _, b in older}
    out: list[JSON] = []
    chars = 0
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        blocks = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                if block.get("tool_use_id") in cleared_ids:
                    chars += len(orjson.dumps(block.get("content")))
                    block = {**block, "content": PLACEHOLDER}
            elif isinstance(block, dict) and block.get("id") in cleared_ids:
                name = cleared_ids[block.get("id")]
                if inputs is True or (isinstance(inputs, list) and name in inputs):
                    chars += len(orjson.dumps(block.get("input")))
                    block = {**block, "input": {}}
            blocks.append(block)
        out.append({**message, "content": blocks})
    least = _value(edit.get("clear_at_least"), 0)
    if not cleared_ids or chars // 4 < least:
        return messages
    applied.edits.append(
        {
            "type": "clear_tool_uses_20250919",
            "cleared_tool_uses": len(cleared_ids),
            "cleared_input_tokens": chars // 4,
        }
    )
    return out


def _clear_thinking(messages: list[JSON], edit: JSON, applied: Applied) -> list[JSON]:
    keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
    if keep == "all" or (isinstance(keep, Mapping) and keep.get("type") == "all"):
        return messages
    turns = [
        i
        for i, m in enumerate(messages)
        if m.get("role") == "assistant"
        and isinstance(m.get("content"), list)
        and any(
            isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")
            for b in m["content"]
        )
    ]
    cleared = turns[: max(0, len(turns) - _value(keep, 1))]
    if not cleared:
        return messages
    out = list(messages)
    chars = 0
    for i in cleared:
        content = out[i]["content"]
        thinking = [b for b in content if b.get("type") in ("thinking", "redacted_thinking")]
        chars += sum(len(str(b.get("thinking") or b.get("data") or "")) for b in thinking)
        out[i] = {**out[i], "content": [b for b in content if b not in thinking]}
    applied.edits.append(
        {
            "type": "clear_thinking_20251015",
            "cleared_thinking_turns": len(cleared),
            "cleared_input_tokens": chars // 4,
        }
    )
    return out


def _compact(messages: list[JSON], edit: JSON, tokens: int, applied: Applied) -> list[JSON]:
    if tokens <= _value(edit.get("trigger"), 150_000):
        return messages
    applied.compaction = SUMMARY.format(count=len(messages))
    return [{"role": "user", "content": [{"type": "text", "text": applied.compaction}]}]


def report(message: JSON, applied: Applied | None) -> JSON:
    """A rendered message with what the edits did: the compaction block first, then the
    answer; `context_management` when the request asked for any."""
    if applied is None:
        return message
    if applied.compaction is not None:
        block = {"type": "compaction", "content": applied.compaction}
        message = {**message, "content": [block, *message["content"]]}
    if applied.requested:
        message = {**message, "context_management": {"applied_edits": applied.edits}}
    return message
