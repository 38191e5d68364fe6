"""Prompt caching in the Anthropic twin: `cache_control` breakpoints and honest cache usage.

The prompt is read in the API's cache order — tools, then system, then messages — one content
block at a time. A breakpoint (a block with `cache_control`) writes the prefix ending at it to
the cache, when that prefix reaches the minimum cacheable length. A later request reads the
longest cached prefix that ends at one of its breakpoints or at one of the 20 block boundaries
before each (the API's lookback, which is what makes a breakpoint that moves to the newest
block every turn still hit). The usage then says: cache read = the tokens of that prefix, cache
creation = the tokens from there up to the last breakpoint, input = the rest. The cache is per
Simulator, keyed by hashes of prefixes, and bounded in entries and time (like the API's 5-minute
lifetime, refreshed on each hit).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import TTLCache

from .model import JSON
from .wire import ApiError

MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
DEFAULT_MIN_TOKENS = 1024  # the smallest prefix the API caches (Sonnet / Opus)
DEFAULT_ENTRIES = 4096
DEFAULT_TTL_S = 300.0

Cut = tuple[str, int, int]  # (section, index, block index): the prefix ends after this block


@dataclass(frozen=True)
class CacheUsage:
    read: int = 0
    creation: int = 0


@dataclass(frozen=True)
class _Block:
    cut: Cut
    digest: bytes  # of the whole prefix up to and including this block
    breakpoint: bool


def _has_breakpoint(block: Any) -> bool:
    return isinstance(block, dict) and block.get("cache_control") is not None


def count_breakpoints(body: JSON) -> int:
    """Blocks with cache_control anywhere the API reads them: tools, system, message blocks
    (tool_result contents included), plus the top-level `cache_control` (automatic caching,
    which marks the last block and takes one of the four slots)."""
    count = int(body.get("cache_control") is not None)
    count += sum(_has_breakpoint(tool) for tool in _list(body.get("tools")))
    count += sum(_has_breakpoint(block) for block in _list(body.get("system")))
    for message in _list(body.get("messages")):
        for block in _list(message.get("content") if isinstance(message, dict) else None):
            count += _has_breakpoint(block)
            if isinstance(block, dict) and block.get("type") == "tool_result":
                count += sum(_has_breakpoint(inner) for inner in _list(block.get("content")))
    return count


def check_breakpoints(body: JSON) -> ApiError | None:
    found = count_breakpoints(body)
    if found <= MAX_BREAKPOINTS:
        return None
    return ApiError(
        400,
        f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {found}.",
    )


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _without_cache_control(block: Any) -> Any:
    if isinstance(block, dict) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def _prompt_blocks(body: JSON) -> Iterator[tuple[Cut, Any, Any]]:
    """(cut, what identifies the block, the block) in cache order."""
    for i, tool in enumerate(_list(body.get("tools"))):
        yield ("tools", i, 0), ("tool", tool), tool
    system = body.get("system")
    if isinstance(system, str) and system:
        yield ("system", 0, 0), ("system", system), system
    for k, block in enumerate(_list(system)):
        yield ("system", 0, k), ("system", block), block
    for i, message in enumerate(_list(body.get("messages"))):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            yield ("messages", i, 0), (role, 0, content), content
            continue
        for k, block in enumerate(content):
            # The role opens each message, so [user a][user b] differs from [user a, b].
            yield ("messages", i, k), (role, k, block), block


def _blocks(body: JSON) -> list[_Block]:
    running = hashlib.blake2b(orjson.dumps(body.get("model")), digest_size=16)
    blocks = []
    for cut, identity, block in _prompt_blocks(body):
        if isinstance(identity[-1], dict):
            identity = (*identity[:-1], _without_cache_control(identity[-1]))
        running.update(orjson.dumps(identity, option=orjson.OPT_SORT_KEYS))
        blocks.append(_Block(cut, running.digest(), _has_breakpoint(block)))
    if blocks and body.get("cache_control") is not None:  # automatic: the last block
        blocks[-1] = dataclasses.replace(blocks[-1], breakpoint=True)
    return blocks


def prefix_body(body: JSON, cut: Cut) -> JSON:
    """The request truncated after the block at `cut`, to count the prefix's tokens."""
    section, index, k = cut
    prefix: JSON = {
        "model": body.get("model"),
        "max_tokens": body.get("max_tokens"),
        "messages": [],
    }
    tools = _list(body.get("tools"))
    if section == "tools":
        return prefix | {"tools": tools[: index + 1]}
    prefix["tools"] = tools
    system = body.get("system")
    if section == "system":
        return prefix | {"system": system[: k + 1] if isinstance(system, list) else system}
    prefix["system"] = system
    messages = _list(body.get("messages"))
    last = messages[index]
    if isinstance(last.get("content"), list):
        last = last | {"content": last["content"][: k + 1]}
    return prefix | {"messages": [*messages[:index], last]}


class PromptCache:
    def __init__(
        self,
        *,
        min_tokens: int = DEFAULT_MIN_TOKENS,
        entries: int = DEFAULT_ENTRIES,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        self.min_tokens = min_tokens
        self._seen: TTLCache[bytes, None] = TTLCache(entries, ttl_s, timer=time.monotonic)

    def clear(self) -> None:
        self._seen.clear()

    def account(self, body: JSON, count_tokens: Callable[[JSON], int]) -> CacheUsage:
        """Read the cache for `body` and write its breakpoints; `count_tokens(prefix body)`
        counts a prefix's tokens the way the whole prompt is counted."""
        blocks = _blocks(body)
        breakpoints = [n for n, block in enumerate(blocks) if block.breakpoint]
        if not breakpoints:
            return CacheUsage()
        candidates: set[int] = set()
        for n in breakpoints:
            candidates.update(range(max(0, n - LOOKBACK_BLOCKS), n + 1))
        hit = max((n for n in candidates if blocks[n].digest in self._seen), default=None)
        counted: dict[int, int] = {}

        def tokens(n: int) -> int:
            if n not in counted:
                counted[n] = count_tokens(prefix_body(body, blocks[n].cut))
            return counted[n]

        read = tokens(hit) if hit is not None else 0
        if hit is not None:
            self._seen[blocks[hit].digest] = None  # a hit refreshes the entry's lifetime
        last = breakpoints[-1]
        creation = 0
        if tokens(last) >= self.min_tokens and (hit is None or last > hit):
            creation = tokens(last) - read
        for n in breakpoints:
            if tokens(n) >= self.min_tokens:
                self._seen[blocks[n].digest] = None
        return CacheUsage(read, creation)
