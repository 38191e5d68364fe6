"""Step a of fitting: shorten the long string arguments of old writing-tool calls.

A file body the agent wrote twenty turns ago is rarely needed verbatim, and it is often the
biggest thing in the history. Each long string becomes its head plus a marker naming the
stored full value. The result is a pure function of (session, message, spec), so the same
message always truncates to the same bytes; a cache keyed by the message's hash makes a warm
turn cost one hash per truncated message and no store writes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from cachetools import LRUCache

from proxy.exchange import Exchange
from proxy.json_depth import nested_too_deep
from proxy.messages import Message, message_hash
from proxy.pipeline.fit_budget import message_tokens
from proxy.policies.spec import CompactionSpec
from proxy.store.base import BlobInfo, Store, content_ref

KIND = "tool_arguments"
MARKER = "… [agentproxy] {chars} chars truncated; the full value is archived as {ref} ({how})"
HOW_RECALL = "call agentproxy_recall with that ref to read it"
HOW_HTTP = "GET /v1/agentproxy/archive/{ref} returns it"

CacheKey = tuple[str, int, int, int, tuple[str, ...], bool]


@dataclass(slots=True)
class Truncated:
    messages: list[Message]  # the given slice, truncated messages replaced by copies
    arguments: int = 0  # arguments truncated in the slice
    stored: int = 0  # of which written to the store just now (not seen before in this process)
    failed: int = 0  # store writes that failed (those arguments stay whole)
    saved: dict[int, int] = field(default_factory=dict)  # message index → tokens saved


def truncatable(message: Message, spec: CompactionSpec) -> bool:
    """Cheap pre-check: an assistant call of a writing tool with arguments long enough."""
    if message.get("role") != "assistant" or not message.get("tool_calls"):
        return False
    for call in message["tool_calls"]:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or function.get("name") not in spec.truncate_tools:
            continue
        arguments = function.get("arguments")
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
        self, ex: Exchange, store: Store, messages: Sequence[Message], start: int, stop: int
    ) -> Truncated:
        spec = ex.policy.compaction
        recall = ex.policy.recall.enabled
        out = list(messages[start:stop])
        result = Truncated(out)
        for offset, message in enumerate(out):
            if not truncatable(message, spec):
                continue
            key: CacheKey = (
                ex.session,
                message_hash(message),
                spec.truncate_min_chars,
                spec.truncate_head_chars,
                spec.truncate_tools,
                recall,
            )
            done = self._done.get(key)
            if done is None:
                (short, count), failed = await _truncate_message(ex, store, message, spec, recall)
                kept = message_tokens(short)
                done = (short, count, message_tokens(message) - kept, 4 * kept + 256)
                result.failed += failed
                result.stored += count
                if not failed:  # a failed write is retried on a later turn
                    self._done[key] = done
            out[offset] = done[0]
            result.arguments += done[1]
            if done[1]:
                result.saved[start + offset] = done[2]
        return result


async def _truncate_message(
    ex: Exchange, store: Store, message: Message, spec: CompactionSpec, recall: bool
) -> tuple[tuple[Message, int], int]:
    calls, count, failed = [], 0, 0
    for call in message["tool_calls"]:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if (
            not isinstance(function, dict)
            or function.get("name") not in spec.truncate_tools
            or not isinstance(arguments, str)
            or len(arguments) <= spec.truncate_min_chars
        ):
            calls.append(call)
            continue
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            calls.append(call)  # malformed: repair reports it; never make it worse
            continue
        if nested_too_deep(arguments, parsed):
            calls.append(call)  # walked by recursion below; the provider will refuse it anyway
            continue
        long_values: list[tuple[str, str]] = []  # (path, value)
        _collect_long(parsed, "", spec.truncate_min_chars, long_values)
        replaced: dict[str, str] = {}
        for path, value in long_values:
            ref = await _store_value(ex, store, value, function["name"], call, path)
            if ref is None:
                failed += 1
                continue
            how = HOW_RECALL if recall else HOW_HTTP.format(ref=ref)
            marker = MARKER.format(chars=len(value), ref=ref, how=how)
            replaced[path] = value[: spec.truncate_head_chars] + marker
        if not replaced:
            calls.append(call)
            continue
        count += len(replaced)
        shortened = orjson.dumps(_replace(parsed, "", replaced)).decode()
        calls.append({**call, "function": {**function, "arguments": shortened}})
    return ({**message, "tool_calls": calls}, count), failed


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


async def _store_value(
    ex: Exchange, store: Store, value: str, tool: str, call: dict[str, Any], path: str
) -> str | None:
    """Written before it leaves the context (recoverable); None when the store failed."""
    data = value.encode()
    ref = content_ref(ex.session, KIND, data)
    meta = {"tool": tool, "call_id": call.get("id"), "argument": path}
    try:
        info = BlobInfo(ref, ex.session, KIND, len(data), time.time(), ex.owner, meta)
        await store.put(info, data)
    except Exception:
        return None
    return ref
