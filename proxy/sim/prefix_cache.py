"""OpenAI-style automatic prompt caching, for the chat and Responses twins.

OpenAI caches every prompt's prefixes on its own (no breakpoints): a later request under the
same model and `prompt_cache_key` reads the longest prefix an earlier one sent — here whole
messages (or input items), after the tools and instructions — and reports it as
`cached_tokens`, counted in steps of 128 tokens once the prefix reaches 1,024. The newest
message is never a hit: only what came before it can have been sent already. Bounded in entries
and time (the API keeps prefixes for minutes).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from cachetools import TTLCache

CACHE_INCREMENT = 128  # cached_tokens come in steps of this many, as at OpenAI


class PrefixCache:
    def __init__(self, *, min_tokens: int = 1024, entries: int = 4096, ttl_s: float = 300.0):
        self.min_tokens = min_tokens
        self._seen: TTLCache[bytes, None] = TTLCache(entries, ttl_s, timer=time.monotonic)

    def clear(self) -> None:
        self._seen.clear()

    def account(
        self, scope: Any, head: Any, items: Sequence[Any], count: Callable[[int], int]
    ) -> int:
        """Read the cache for a prompt of `head` (tools, instructions) then `items`, under
        `scope`, and remember its prefixes. `count(n)` gives the tokens of the prompt cut
        after n items. Returns the cached tokens."""
        running = hashlib.blake2b(orjson.dumps(scope), digest_size=16)
        running.update(orjson.dumps(head, option=orjson.OPT_SORT_KEYS))
        digests = []
        for item in items:
            running.update(orjson.dumps(item, option=orjson.OPT_SORT_KEYS))
            digests.append(running.digest())
        hit = max((n for n, d in enumerate(digests[:-1]) if d in self._seen), default=None)
        for digest in digests:
            self._seen[digest] = None
        if hit is None:
            return 0
        tokens = count(hit + 1)
        if tokens < self.min_tokens:
            return 0
        return tokens - tokens % CACHE_INCREMENT
