"""Anthropic's `context_management` (context editing and server-side compaction), read into the
proxy's wire-neutral `ClientContext` and its results written back in Anthropic's shapes.

    {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens",
                "value": 100000}, "keep": {"type": "tool_uses", "value": 3},
                "clear_at_least": {"type": "input_tokens", "value": 5000},
                "exclude_tools": ["web_search"], "clear_tool_inputs": false},
               {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
               {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 150000},
                "instructions": null, "pause_after_compaction": false}]}

A deployment that speaks Anthropic gets the field as sent, with the beta headers it needs; for
any other the proxy carries the edits out itself (proxy/pipeline/context_edits.py) and reports
them as Anthropic does: `context_management.applied_edits` in the message (and in the stream's
`message_delta`), and a compaction as a `compaction` block opening the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.errors import BadRequest
from proxy.exchange import (
    AppliedEdit,
    ClearThinking,
    ClearToolUses,
    ClientContext,
    Compact,
    ContextEdit,
)
from proxy.json_values import kind

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"
TYPES = (CLEAR_TOOL_USES, CLEAR_THINKING, COMPACT)
# The beta each edit needs on Anthropic's API.
CONTEXT_BETA = "context-management-2025-06-27"
COMPACT_BETA = "compact-2026-01-12"
BETAS = {CLEAR_TOOL_USES: CONTEXT_BETA, CLEAR_THINKING: CONTEXT_BETA, COMPACT: COMPACT_BETA}
MAX_EDITS = 16
MAX_NAMES = 1024  # exclude_tools, clear_tool_inputs
WHERE = "context_management"


def client_context(body: dict[str, Any], compacted: bool) -> ClientContext | None:
    """The request's context instructions (`compacted`: its history holds a compaction block);
    None when it has none. A malformed `context_management` is a 400 naming the field."""
    raw = body.get(WHERE)
    if raw is None and not compacted:
        return None
    edits = _edits(raw) if raw is not None else ()
    # Edits that cut the history (not clear_thinking, which Claude Code sends with keep "all"
    # on every turn), or a compaction the client carries: the client manages its size.
    manages = compacted or any(isinstance(e, ClearToolUses | Compact) for e in edits)
    return ClientContext(edits, manages)


def betas_needed(body: dict[str, Any], sent: str | None) -> str | None:
    """The `anthropic-beta` header a native request with this body needs: the client's own,
    with the betas its edits need added (None: no change)."""
    raw = body.get(WHERE)
    if not isinstance(raw, dict) or not isinstance(raw.get("edits"), list):
        return None
    listed = [name.strip() for name in (sent or "").split(",") if name.strip()]
    wanted = [
        BETAS[edit["type"]]
        for edit in raw["edits"]
        if isinstance(edit, dict) and edit.get("type") in BETAS
    ]
    missing = [b for b in dict.fromkeys(wanted) if b not in listed]
    return ",".join([*listed, *missing]) if missing else None


def applied_edits(applied: list[AppliedEdit]) -> list[dict[str, Any]]:
    """The edits the proxy applied, as Anthropic's `applied_edits` (a compaction is reported
    by its block instead)."""
    out: list[dict[str, Any]] = []
    for edit in applied:
        if edit.edit == "clear_tool_uses":
            out.append(
                {
                    "type": CLEAR_TOOL_USES,
                    "cleared_tool_uses": edit.cleared,
                    "cleared_input_tokens": edit.tokens,
                }
            )
        elif edit.edit == "clear_thinking":
            out.append(
                {
                    "type": CLEAR_THINKING,
                    "cleared_thinking_turns": edit.cleared,
                    "cleared_input_tokens": edit.tokens,
                }
            )
    return out


def compaction_summary(applied: list[AppliedEdit]) -> str | None:
    return next((e.summary for e in applied if e.edit == "compaction"), None)


def provider_edits(data: Any) -> list[str]:
    """The kinds of edit a provider's `context_management.applied_edits` reports."""
    if not isinstance(data, dict):
        return []
    edits = data.get("applied_edits")
    names = {CLEAR_TOOL_USES: "clear_tool_uses", CLEAR_THINKING: "clear_thinking"}
    return [
        names[e["type"]]
        for e in edits or ()
        if isinstance(edits, list) and isinstance(e, dict) and e.get("type") in names
    ]


# --- reading the request ------------------------------------------------------------------------


def _edits(raw: Any) -> tuple[ContextEdit, ...]:
    if not isinstance(raw, dict):
        raise BadRequest(f"{WHERE}: must be an object, not {kind(raw)}", param=WHERE)
    unknown = sorted(set(raw) - {"edits"})
    if unknown:
        raise _bad(f"{WHERE}.{unknown[0]}", "Extra inputs are not permitted")
    edits = raw.get("edits")
    if edits is None:
        return ()
    if not isinstance(edits, list):
        raise _bad(f"{WHERE}.edits", f"must be an array, not {kind(edits)}")
    if len(edits) > MAX_EDITS:
        raise _bad(f"{WHERE}.edits", f"at most {MAX_EDITS} edits")
    out: list[ContextEdit] = []
    for i, edit in enumerate(edits):
        at = f"{WHERE}.edits.{i}"
        if not isinstance(edit, dict):
            raise _bad(at, f"must be an object, not {kind(edit)}")
        tag = edit.get("type")
        if tag not in TYPES:
            expected = ", ".join(f"'{t}'" for t in TYPES)
            raise _bad(
                f"{at}.type",
                f"Input tag {tag!r} found using 'type' does not match any of the expected "
                f"tags: {expected}",
            )
        out.append(_PARSERS[tag](edit, at))
    return tuple(out)


def _clear_tool_uses(edit: dict[str, Any], at: str) -> ClearToolUses:
    _known(edit, at, ("trigger", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"))
    default = ClearToolUses()
    trigger = default.trigger
    if edit.get("trigger") is not None:
        trigger = _counted(edit["trigger"], f"{at}.trigger", ("input_tokens", "tool_uses"))
    keep = default.keep
    if edit.get("keep") is not None:
        keep = _counted(edit["keep"], f"{at}.keep", ("tool_uses",))[1]
    clear_at_least = 0
    if (least := edit.get("clear_at_least")) is not None:
        clear_at_least = _counted(least, f"{at}.clear_at_least", ("input_tokens",))[1]
    exclude = frozenset(_names(edit.get("exclude_tools"), f"{at}.exclude_tools"))
    inputs_raw = edit.get("clear_tool_inputs")
    inputs: bool | frozenset[str]
    if inputs_raw is None or isinstance(inputs_raw, bool):
        inputs = bool(inputs_raw)
    else:
        inputs = frozenset(_names(inputs_raw, f"{at}.clear_tool_inputs"))
    return ClearToolUses(trigger, keep, clear_at_least, exclude, inputs)


def _clear_thinking(edit: dict[str, Any], at: str) -> ClearThinking:
    _known(edit, at, ("keep",))
    keep = edit.get("keep")
    if keep is None:
        return ClearThinking()
    if keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all" and len(keep) == 1):
        return ClearThinking(None)
    return ClearThinking(_counted(keep, f"{at}.keep", ("thinking_turns",))[1])


def _compact(edit: dict[str, Any], at: str) -> Compact:
    _known(edit, at, ("trigger", "instructions", "pause_after_compaction"))
    trigger = Compact().trigger
    if edit.get("trigger") is not None:
        trigger = _counted(edit["trigger"], f"{at}.trigger", ("input_tokens",))[1]
    instructions = edit.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad(f"{at}.instructions", f"must be a string, not {kind(instructions)}")
    pause = edit.get("pause_after_compaction", False)
    if not isinstance(pause, bool):
        raise _bad(f"{at}.pause_after_compaction", f"must be a boolean, not {kind(pause)}")
    return Compact(trigger, instructions, pause)


_PARSERS: dict[str, Callable[[dict[str, Any], str], ContextEdit]] = {
    CLEAR_TOOL_USES: _clear_tool_uses,
    CLEAR_THINKING: _clear_thinking,
    COMPACT: _compact,
}


def _counted(value: Any, at: str, types: tuple[str, ...]) -> tuple[str, int]:
    """A `{"type": ..., "value": n}` object: its type and its count."""
    if not isinstance(value, dict):
        raise _bad(at, f"must be an object, not {kind(value)}")
    tag = value.get("type")
    if tag not in types:
        raise _bad(f"{at}.type", "Input should be " + " or ".join(f"'{t}'" for t in types))
    count = value.get("value")
    if type(count) is not int or count < 0:
        raise _bad(f"{at}.value", "Input should be a non-negative integer")
    return str(tag), count


def _names(value: Any, at: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(at, "must be an array of strings")
    if len(value) > MAX_NAMES:
        raise _bad(at, f"at most {MAX_NAMES} names")
    return value


def _known(edit: dict[str, Any], at: str, fields: tuple[str, ...]) -> None:
    extra = sorted(set(edit) - {"type", *fields})
    if extra:
        raise _bad(f"{at}.{extra[0]}", "Extra inputs are not permitted")


def _bad(at: str, message: str) -> BadRequest:
    return BadRequest(f"{at}: {message}", param=at)


# --- answering --------------------------------------------------------------------------------


def cleared_thinking(
    context: ClientContext, messages: list[dict[str, Any]], start: int
) -> AppliedEdit | None:
    """What clear_thinking_20251015 clears of `messages[start:]` (the history after its last
    compaction): the thinking of every assistant turn but the last `keep` that have some. A
    translated request carries no thinking at all; this is what the client's edit covers."""
    edit = context.edit(ClearThinking)
    if edit is None or edit.keep is None:
        return None
    turns: list[int] = []  # estimated tokens of each turn's thinking
    for message in messages[start:]:
        content = message.get("content")
        if message.get("role") != "assistant" or not isinstance(content, list):
            continue
        thinking = [b for b in content if isinstance(b, dict) and b.get("type") in THINKING_BLOCKS]
        if thinking:
            turns.append(sum(len(str(b.get("thinking") or b.get("data") or "")) for b in thinking))
    cleared = turns[: max(0, len(turns) - edit.keep)]
    if not cleared:
        return None
    return AppliedEdit("clear_thinking", len(cleared), sum(cleared) // 4)


def answered(message: dict[str, Any], context: ClientContext) -> dict[str, Any]:
    """A translated answer with what the proxy carried out for the client, as Anthropic reports
    it: a compaction block opening the content (alone, stop_reason "compaction", when the
    client asked to pause after it) and `context_management.applied_edits`."""
    out = dict(message)
    compaction = next((e for e in context.applied if e.edit == "compaction"), None)
    if compaction is not None:
        block = {"type": "compaction", "content": compaction.summary}
        paused = any(isinstance(e, Compact) and e.pause for e in context.edits)
        if paused and compaction.summary is not None:
            out["content"] = [block]
            out["stop_reason"] = "compaction"
        else:
            out["content"] = [block, *(message.get("content") or [])]
    if context.edits:
        out["context_management"] = {"applied_edits": applied_edits(context.applied)}
    return out


THINKING_BLOCKS = ("thinking", "redacted_thinking")
