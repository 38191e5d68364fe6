"""Step a of fitting: shorten the long string arguments of old writing-tool calls.

A file body the agent wrote twenty turns ago is rarely needed verbatim, and it is often the
biggest thing in the history. Each long string becomes its head plus a marker naming the
stored full value. The result is a pure function of (session, message, spec), so the same
message always truncates to the same bytes; a cache keyed by the message's hash makes a warm
turn cost one hash per truncated message and no store writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from cachetools import LRUCache

from proxy.exchange import Exchange
from proxy.json_values import nested_too_deep
from proxy.messages import Message, call_body, message_hash, takes_json, with_call_input
from proxy.pipeline.archive import Archive, Entry, entry
from proxy.pipeline.compaction.budget import message_tokens
from proxy.pipeline.compaction.summarize import STAGE
from proxy.policies.spec import CompactionSpec

KIND = "tool_arguments"
MARKER = "… [agentproxy] {chars} chars truncated; the full value is archived as {ref} ({how})"
HOW_RECALL = "call agentproxy_recall with that ref to read it"
HOW_HTTP = "GET /v1/agentproxy/archive/{ref} returns it"

CacheKey = tuple[str, int, int, int, tuple[str, ...], bool]


@dataclass(slots=True)
class Truncated:
    messages: list[Message]  # the given slice, truncated messages replaced by copies
    start: int = 0  # where the slice starts in the history
    arguments: int = 0  # arguments truncated in the slice
    stored: int = 0  # of which written to the store just now (not seen before in this process)
    saved: dict[int, int] = field(default_factory=dict)  # message index → tokens saved

    def use(self, index: int, done: tuple[Message, int, int, int]) -> None:
        """Message `index` (of the whole history) becomes its truncated copy."""
        self.messages[index - self.start] = done[0]
        self.arguments += done[1]
        if done[1]:
            self.saved[index] = done[2]


def truncatable(message: Message, spec: CompactionSpec) -> bool:
    """Cheap pre-check: an assistant call of a writing tool with arguments long enough."""
    if message.get("role") != "assistant" or not message.get("tool_calls"):
        return False
    for call in message["tool_calls"]:
        body, key = call_body(call)
        if body is None or body.get("name") not in spec.truncate_tools:
            continue
        arguments = body.get(key)
        if isinstance(arguments, str) and len(arguments) > spec.truncate_min_chars:
            return True
    return False


class Truncator:
    def __init__(self, max_bytes: int = 16 * 1024 * 1024) -> None:
        # message hash (and all the result depends on) → (truncated copy, arguments, tokens
        # saved, its size): bounded by the size of the copies kept.
        self._done: LRUCache[CacheKey, tuple[Message, int, int, int]] = LRUCache(
            max_bytes, getsizeof=lambda done: done[3]
        )

    @property
    def memo(self) -> LRUCache[CacheKey, tuple[Message, int, int, int]]:
        return self._done

    async def apply(
        self, ex: Exchange, archive: Archive, messages: Sequence[Message], start: int, stop: int
    ) -> Truncated:
        spec = ex.policy.compaction
        recall = ex.policy.recall.enabled
        out = list(messages[start:stop])
        result = Truncated(out, start)
        fresh: list[tuple[int, CacheKey, _Plan]] = []  # not truncated before in this process
        for offset, message in enumerate(out):
            if not truncatable(message, spec):
                continue
            key: CacheKey = (
                ex.identity.session,
                message_hash(message),
                spec.truncate_min_chars,
                spec.truncate_head_chars,
                spec.truncate_tools,
                recall,
            )
            done = self._done.get(key)
            if done is None:
                fresh.append((offset, key, _plan(ex, message, spec)))
            else:
                result.use(start + offset, done)
        if not fresh:
            return result
        # Recoverable law: every value is stored before it is cut; one batch for the slice.
        entries = [long.entry for _, _, plan in fresh for long in plan.longs]
        stored = await archive.keep(ex, STAGE, entries)
        for offset, key, plan in fresh:
            short, count = _shortened(plan, stored, spec, recall)
            kept = message_tokens(short)
            done = (short, count, message_tokens(plan.message) - kept, 4 * kept + 256)
            result.stored += count
            if all(long.entry.ref in stored for long in plan.longs):
                self._done[key] = done  # a failed write is retried on a later turn
            result.use(start + offset, done)
        return result


@dataclass(frozen=True, slots=True)
class _Long:
    """One long string argument: where it is, and its archive entry."""

    call: int  # index in the message's tool_calls
    path: str  # inside the call's parsed arguments, e.g. "edits[0].new_string" ("": all of it)
    value: str
    entry: Entry


@dataclass(frozen=True, slots=True)
class _Plan:
    message: Message
    # call index → its parsed arguments (calls with long values only; a custom call's input
    # is one free-text value, its own whole)
    parsed: dict[int, Any]
    longs: list[_Long]


def _plan(ex: Exchange, message: Message, spec: CompactionSpec) -> _Plan:
    """The long values of a message's writing-tool calls, each with its archive entry."""
    parsed_calls: dict[int, Any] = {}
    longs: list[_Long] = []
    for index, call in enumerate(message["tool_calls"]):
        body, key = call_body(call)
        arguments = body.get(key) if body is not None else None
        if (
            body is None
            or body.get("name") not in spec.truncate_tools
            or not isinstance(arguments, str)
            or len(arguments) <= spec.truncate_min_chars
        ):
            continue
        meta = {"tool": body["name"], "call_id": call.get("id"), "argument": key}
        if not takes_json(call):  # a custom tool's input (apply_patch's patch): free text
            parsed_calls[index] = arguments
            longs.append(_Long(index, "", arguments, entry(ex, KIND, arguments.encode(), **meta)))
            continue
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            continue  # malformed: repair reports it; never make it worse
        if nested_too_deep(arguments, parsed):
            continue  # walked by recursion below; the provider will refuse it anyway
        found: list[tuple[str, str]] = []  # (path, value)
        _collect_long(parsed, "", spec.truncate_min_chars, found)
        if not found:
            continue
        parsed_calls[index] = parsed
        for path, value in found:
            meta = {"tool": body["name"], "call_id": call.get("id"), "argument": path}
            longs.append(_Long(index, path, value, entry(ex, KIND, value.encode(), **meta)))
    return _Plan(message, parsed_calls, longs)


def _shortened(
    plan: _Plan, stored: set[str], spec: CompactionSpec, recall: bool
) -> tuple[Message, int]:
    """The message with every stored long value cut to its head and a marker (the values
    whose write failed stay whole), and how many were cut."""
    replaced: dict[int, dict[str, str]] = {}  # call index → path → its shortened value
    for long in plan.longs:
        ref = long.entry.ref
        if ref not in stored:
            continue
        how = HOW_RECALL if recall else HOW_HTTP.format(ref=ref)
        marker = MARKER.format(chars=len(long.value), ref=ref, how=how)
        replaced.setdefault(long.call, {})[long.path] = (
            long.value[: spec.truncate_head_chars] + marker
        )
    calls, count = [], 0
    for index, call in enumerate(plan.message["tool_calls"]):
        paths = replaced.get(index)
        if not paths:
            calls.append(call)
            continue
        count += len(paths)
        if not takes_json(call):  # free text: its head and the marker
            calls.append(with_call_input(call, paths[""]))
            continue
        shortened = orjson.dumps(_replace(plan.parsed[index], "", paths)).decode()
        calls.append(with_call_input(call, shortened))
    return {**plan.message, "tool_calls": calls}, count


def _collect_long(value: Any, path: str, min_chars: int, found: list[tuple[str, str]]) -> None:
    """Every string longer than min_chars, nested ones too (multi_edit's edit lists)."""
    if isinstance(value, str):
        if len(value) > min_chars:
            found.append((path, value))
    elif isinstance(value, dict):
        for name, item in value.items():
            _collect_long(item, f"{path}.{name}" if path else str(name), min_chars, found)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _collect_long(item, f"{path}[{index}]", min_chars, found)


def _replace(value: Any, path: str, replaced: dict[str, str]) -> Any:
    if isinstance(value, str):
        return replaced.get(path, value)
    if isinstance(value, dict):
        return {
            name: _replace(item, f"{path}.{name}" if path else str(name), replaced)
            for name, item in value.items()
        }
    if isinstance(value, list):
        return [_replace(item, f"{path}[{i}]", replaced) for i, item in enumerate(value)]
    return value
