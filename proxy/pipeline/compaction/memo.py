"""What the compaction stage saw of each session last turn, so a warm turn pays only for the
new messages.

Turn N+1 is turn N plus new messages. Checking that shared part with `==` (C-level, ~0.1 µs a
message) is much cheaper than estimating it again (~1 µs) or hashing it (~2.5 µs), so the
estimates and prefix hashes of the shared part are reused and only the new messages cost
Python-level work. Caveat of `==`: it treats 1, 1.0 and True alike, so a history that changed
only that way counts as unchanged; nothing else can slip through.

Bounded by the characters held (a parsed history is kept per session), not by session count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cachetools import LRUCache

from proxy.messages import Message, prefix_hashes
from proxy.pipeline.compaction.budget import message_tokens

DEFAULT_MAX_CHARS = 64_000_000


@dataclass(slots=True)
class Seen:
    """One turn's history as the stage saw it, with what was computed about it."""

    messages: list[Message]  # a copy of the list: callers may append to theirs
    costs: list[int]  # token estimate of each message
    hashes: list[int] = field(default_factory=list)  # prefix hashes of the first len(hashes)
    exact: int = 0  # the first `exact` costs are the model tokenizer's counts (pipeline/meter)
    estimated: int = 0  # the estimate of those first `exact` messages: the text's density
    basis: object | None = (
        None  # the turn whose client list this is (ex.rewrite.turn), if it is one
    )
    counted_by: str = ""  # the tokenizer of those counts (a fallback's model may differ)

    @property
    def chars(self) -> int:
        return 4 * sum(self.costs) + 64 * len(self.costs)

    def prefix_hashes(self, length: int) -> list[int]:
        """prefix_hashes(messages[:length]), carried over from earlier turns when possible."""
        length = min(length, len(self.messages))
        if len(self.hashes) < length:
            self.hashes = prefix_hashes(self.messages[:length])
        return self.hashes[:length]


class SeenHistories:
    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self._seen: LRUCache[str, Seen] = LRUCache(max_chars, getsizeof=lambda s: s.chars)

    @property
    def memo(self) -> LRUCache[str, Seen]:
        return self._seen

    def remember(
        self,
        session: str,
        messages: list[Message],
        known_shared: Callable[[object | None], int] | None = None,
        basis: object | None = None,
    ) -> Seen:
        """This turn's history, reusing what was computed for the part shared with the last.
        `known_shared(last_basis)`: leading messages the caller knows equal to those of the
        turn the last history came from (pipeline/base.py:reusable); `basis`: this one's."""
        last = self._seen.get(session)
        if last is not None and (
            (known_shared is not None and len(last.messages) <= known_shared(last.basis))
            or last.messages == messages[: len(last.messages)]
        ):
            costs = last.costs + list(map(message_tokens, messages[len(last.messages) :]))
            exact = min(last.exact, len(messages))
            seen = Seen(
                list(messages), costs, last.hashes, exact, last.estimated, basis, last.counted_by
            )
        else:
            seen = Seen(list(messages), list(map(message_tokens, messages)), basis=basis)
        if seen.chars <= self._seen.maxsize:
            self._seen[session] = seen
        return seen
