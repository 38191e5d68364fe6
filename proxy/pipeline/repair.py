"""Repair tool calls: any history in, a history that keeps the provider's pairing rules out.

Agents crash, get cancelled and trim their own histories, leaving tool calls without results,
results without calls, duplicate results and results that drifted away from their call; OpenAI
answers each with a 400. This stage fixes them as deepagents' PatchToolCallsMiddleware does
inside an agent, deterministically, so the same history always becomes the same bytes.

Prefix stability: a message's repair depends only on the messages before it, with one
exception that is correct behaviour — a call left dangling gets a synthetic result only until a
later message brings its real result; from then on the real result sits in that place.
"""

from __future__ import annotations

import itertools
from collections.abc import Set as AbstractSet
from typing import Any

import orjson
from cachetools import LRUCache

from proxy.exchange import Exchange
from proxy.messages import CUSTOM, Message, call_name, takes_json, text_of, tool_call_ids
from proxy.pipeline.archive import Entry, entry
from proxy.pipeline.base import StageContext, forget_sessions, record, reusable
from proxy.pipeline.text_memo import TextMemo
from proxy.policies.spec import Policy
from proxy.store.base import content_ref

DANGLING = (
    "Tool call {name} with id {id} did not complete - no result was recorded. "
    "It may have been cancelled or interrupted."
)
ORPHAN_NOTE = (
    "[agentproxy] A tool result arrived for call {id} ({n} chars) without a matching tool call, "
    "so it was set aside (archived as {ref}): {head}"
)
SYNTHETIC_MARK = " did not complete - no result was recorded."


def is_synthetic(message: Message) -> bool:
    """Whether a tool message is this stage's stand-in for a result that never came (another
    wire format renders it as an error result)."""
    content = message.get("content")
    call_id = message.get("tool_call_id")
    return (
        isinstance(content, str)
        and content.startswith("Tool call ")
        and (f" with id {call_id}{SYNTHETIC_MARK}" in content)
    )


# When the archive cannot take a result repair moves out of the tool sequence, it stays whole.
KEPT_NOTE = (
    "[agentproxy] A tool result for call {id} could not stay where it was ({why}) nor be "
    "archived, so here it is in full:\n{text}"
)
SET_ASIDE = "set_aside"  # store kind of results repair takes out of the history
BAD_ARGUMENTS_MARK = "[agentproxy] The arguments of this call were not valid JSON"
BAD_ARGUMENTS = BAD_ARGUMENTS_MARK + ", so the tool probably did not run as intended: {head}\n"
# Recorded in this order, one line per kind with a count and the ids.
ACTIONS = (
    "patched_dangling",
    "moved_result",
    "dropped_duplicate",
    "noted_orphan",
    "dropped_orphan",
    "flagged_bad_arguments",
)

Fixes = dict[str, list[str]]  # action -> tool call ids it was applied to


class RepairStage:
    name = "repair"

    def __init__(self, sessions: int = 65_536) -> None:
        # Per session: how many leading messages were last seen clean (no call left open), and
        # on which turn.
        self._clean: LRUCache[str, tuple[int, object | None]] = LRUCache(sessions)

    def enabled(self, policy: Policy) -> bool:
        return policy.repair.enabled

    def forget(self, sessions: set[str]) -> None:
        forget_sessions(sessions, named=[self._clean])

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        clean, basis = self._clean.get(ex.identity.session, (0, None))
        start = clean if 0 < clean <= reusable(ex, messages, basis) else 0
        if _is_clean(messages, start):
            if messages is ex.messages:  # the client's list: the next turn can compare to it
                self._clean[ex.identity.session] = (len(messages), ex.rewrite.turn)
            return None
        self._clean.pop(ex.identity.session, None)
        fixes: Fixes = {}
        removed: list[int] = []
        drop = ex.policy.repair.orphans == "drop"
        repaired = repair(
            messages, fixes, drop_orphans=drop, session=ex.identity.session, removed=removed
        )
        # Recoverable law: what repair takes out is archived first; what cannot be stays in
        # the context, as a note holding it whole (a valid history matters, and so does it).
        entries = {index: _entry(ex, messages[index]) for index in removed}
        stored = await ctx.archive.keep(ex, self.name, list(entries.values()))
        refs = [e.ref for e in entries.values() if e.ref in stored]
        if len(refs) < len(entries):
            whole = {index for index, e in entries.items() if e.ref not in stored}
            fixes = {}
            repaired = repair(
                messages, fixes, drop_orphans=drop, session=ex.identity.session, whole=whole
            )
        for action in ACTIONS:
            if ids := fixes.get(action):
                record(ex, ctx, self.name, action, count=len(ids), tool_call_ids=ids)
        if refs:
            record(ex, ctx, self.name, "archived", count=len(refs), refs=refs)
        return repaired if fixes else None


def _is_clean(messages: list[Message], start: int = 0) -> bool:
    """The common case in one pass, copying nothing: every call answered right after it, no
    stray results, arguments that parse. Any doubt (an odd shape included) says False, and the
    full repair decides."""
    pending: set[str] = set()  # ids of the latest call block not answered yet
    try:
        for message in itertools.islice(messages, start, None):
            role = message.get("role")
            if role == "tool":
                call_id = message.get("tool_call_id")
                if type(call_id) is not str:
                    return False
                pending.remove(call_id)
            elif pending:
                return False
            elif role == "assistant" and (calls := message.get("tool_calls")):
                pending = {call["id"] for call in calls}
                for call in calls:
                    if call.get("type") == CUSTOM:
                        continue  # free text (a patch, a script): nothing to parse
                    if (arguments := call["function"].get("arguments")) and not _parses(arguments):
                        return False
    except (KeyError, TypeError, AttributeError):
        return False
    return not pending


def _parses_now(arguments: str) -> bool:
    try:
        orjson.loads(arguments)
    except ValueError:  # orjson's error is a ValueError
        return False
    return True


# The agent re-sends every old call each turn: a hit replaces a JSON parse per call per turn.
# Long arguments (file bodies) are few and simply parsed again.
_parsed = TextMemo(lambda _, arguments: _parses_now(arguments))


def _parses(arguments: str) -> bool:
    return _parsed("", arguments)


def repair(
    messages: list[Message],
    fixes: Fixes,
    *,
    drop_orphans: bool = False,
    session: str = "",
    removed: list[int] | None = None,
    whole: AbstractSet[int] = frozenset(),
) -> list[Message]:
    """A valid copy of `messages`, reusing every dict it does not change; `fixes` collects what
    was done, `removed` the indexes of the tool messages taken out (to archive: nothing is
    lost), except those in `whole` (could not be archived), which stay as a note holding their
    whole text. Non-tool messages keep their order; each call block is followed by its
    results."""
    answers, orphans = _assign_results(messages, fixes)
    assigned = {j for results in answers.values() for j in results}
    removed = removed if removed is not None else []
    out: list[Message] = []
    for index, message in enumerate(messages):
        if message.get("role") == "tool":
            # Results travel with their call block; only orphans keep a place of their own.
            if index in orphans:
                call_id = str(message.get("tool_call_id"))
                if index in whole:
                    fixes.setdefault("noted_orphan", []).append(call_id)
                    out.append(_kept_note(call_id, message, "no tool call asked for it"))
                    continue
                fixes.setdefault("dropped_orphan" if drop_orphans else "noted_orphan", []).append(
                    call_id
                )
                removed.append(index)
                if not drop_orphans:
                    out.append(_orphan_note(call_id, message, set_aside_ref(session, message)))
            elif index not in assigned:  # a duplicate answer
                if index in whole:
                    call_id = str(message.get("tool_call_id"))
                    out.append(_kept_note(call_id, message, "its call already had a result"))
                else:
                    removed.append(index)
            continue
        out.append(message)
        if index in answers:  # a fresh list the block may extend
            out.extend(_answer_block(message, [messages[j] for j in answers[index]], fixes))
    return out


def _assign_results(messages: list[Message], fixes: Fixes) -> tuple[dict[int, list[int]], set[int]]:
    """Which call block each tool message belongs to (by index), and which answer nothing.

    A result answers the latest earlier call with its id that is still unanswered, so ids that
    agents reuse across turns ("call_0") pair up turn by turn; later results for an answered id
    are duplicates and dropped (the first one is kept).
    """
    unanswered: dict[str, int] = {}  # call id -> index of the assistant message that made it
    answered: set[str] = set()
    answers: dict[int, list[int]] = {}  # assistant index -> indexes of its results, in order
    orphans: set[int] = set()
    block = -1  # the assistant whose block the current run of tool messages directly follows
    for index, message in enumerate(messages):
        if message.get("role") != "tool":
            block = -1
            if message.get("role") == "assistant" and (ids := tool_call_ids(message)):
                block = index
                answers[index] = []
                unanswered.update(dict.fromkeys(ids, index))
            continue
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            orphans.add(index)
        elif (owner := unanswered.pop(call_id, None)) is not None:
            answers[owner].append(index)
            answered.add(call_id)
            if owner != block:
                fixes.setdefault("moved_result", []).append(call_id)
        elif call_id in answered:
            fixes.setdefault("dropped_duplicate", []).append(call_id)
        else:
            orphans.add(index)
    return answers, orphans


def _answer_block(assistant: Message, results: list[Message], fixes: Fixes) -> list[Message]:
    """The call's own results in their order, then a synthetic one per call left unanswered;
    results of calls with malformed arguments say so first."""
    calls: dict[str, Any] = {}
    for call in assistant["tool_calls"]:
        if isinstance(call, dict) and isinstance(call_id := call.get("id"), str):
            calls.setdefault(call_id, call)
    if len(results) < len(calls):
        have = {result["tool_call_id"] for result in results}
        missing = [call_id for call_id in calls if call_id not in have]
        fixes.setdefault("patched_dangling", []).extend(missing)
        results += [_synthetic_result(call_id, calls[call_id]) for call_id in missing]
    return [_flag_bad_arguments(calls[r["tool_call_id"]], r, fixes) for r in results]


def _synthetic_result(call_id: str, call: dict[str, Any]) -> Message:
    name = call_name(call)
    text = DANGLING.format(name=name or "unknown", id=call_id)
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _flag_bad_arguments(call: dict[str, Any], result: Message, fixes: Fixes) -> Message:
    arguments = _bad_arguments(call)
    if arguments is None:
        return result
    prefix = BAD_ARGUMENTS.format(head=arguments[:200])
    content = result.get("content")
    if content is None:
        content = ""
    if isinstance(content, str):
        if content.startswith(BAD_ARGUMENTS_MARK):
            return result  # flagged by an earlier pass: repairing is idempotent
        flagged: Any = prefix + content
    elif isinstance(content, list):
        first = content[0] if content else None
        if isinstance(first, dict) and str(first.get("text", "")).startswith(BAD_ARGUMENTS_MARK):
            return result
        flagged = [{"type": "text", "text": prefix}, *content]
    else:
        return result  # not a content shape providers accept; leave it to their own error
    fixes.setdefault("flagged_bad_arguments", []).append(str(result["tool_call_id"]))
    return {**result, "content": flagged}


def _bad_arguments(call: dict[str, Any]) -> str | None:
    """The raw arguments when they are a string that does not parse as JSON. Empty arguments
    are fine: clients send "" for tools without parameters, and frameworks read it as {}. A
    custom tool's input is free text, never checked."""
    if not takes_json(call):
        return None
    function = call.get("function")
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str) or not arguments or arguments.isspace():
        return None
    try:
        orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    return None


def _orphan_note(call_id: str, message: Message, ref: str) -> Message:
    text = text_of(message)
    note = ORPHAN_NOTE.format(id=call_id, n=len(text), ref=ref, head=text[:500])
    return {"role": "user", "content": note}


def _kept_note(call_id: str, message: Message, why: str) -> Message:
    note = KEPT_NOTE.format(id=call_id, why=why, text=text_of(message))
    return {"role": "user", "content": note}


def set_aside_ref(session: str, message: Message) -> str:
    return content_ref(session, SET_ASIDE, _canonical(message))


def _canonical(message: Message) -> bytes:
    return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)


def _entry(ex: Exchange, message: Message) -> Entry:
    meta = {"tool_call_id": message.get("tool_call_id"), "chars": len(text_of(message))}
    return entry(ex, SET_ASIDE, _canonical(message), **meta)
