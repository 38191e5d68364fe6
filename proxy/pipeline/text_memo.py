"""What a pure function said of a short text, remembered by the text's digest.

The agent re-sends every old tool call each turn, and each turn's parse makes new strings of
them: remembering a parse or a hash saves that work per call per turn. Keyed by the text
itself (functools.lru_cache), a memo kept every text it saw alive, 16,384 of up to 4 KiB each,
scattered through the C heap among the request's short-lived blocks, for as long as new texts
took to push them out (about an hour under bench/load.py): the proxy's memory grew all that
time and nothing counted it. Keyed by a 128-bit digest, an entry is a few small objects, and
hashing the text is cheaper than the string hash the old key needed.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Generic, TypeVar

import xxhash

T = TypeVar("T")
_MISSING = object()
# Per process: texts come from clients, and none may craft two that share a key.
_SEED = secrets.randbits(64)


class TextMemo(Generic[T]):
    """`compute(tag, text)`, remembered when both together are at most `max_chars`; `tag` (a
    tool's name) is kept as it is. Past `max_entries` the memo starts again empty (a few
    recomputed turns, no bookkeeping on the hot path)."""

    def __init__(
        self, compute: Callable[[str, str], T], max_chars: int = 4096, max_entries: int = 16_384
    ) -> None:
        self.compute = compute
        self.max_chars = max_chars
        self.max_entries = max_entries
        self._found: dict[tuple[str, int], T] = {}

    def __len__(self) -> int:
        return len(self._found)

    def __call__(self, tag: str, text: str) -> T:
        if len(text) + len(tag) > self.max_chars:  # the tag is kept: bounded too
            return self.compute(tag, text)
        digest = xxhash.xxh3_128_intdigest(text.encode("utf-8", "surrogatepass"), _SEED)
        key = (tag, digest)
        found = self._found.get(key, _MISSING)
        if found is _MISSING:
            if len(self._found) >= self.max_entries:
                self._found.clear()
            found = self._found[key] = self.compute(tag, text)
        return found  # type: ignore[return-value]
