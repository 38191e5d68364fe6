"""Each session's last view of its history, so that the next turn's view is built only from
what is new (a turn re-sends the whole history): see AnthropicView.of / ResponsesView.of.

Keyed by the scoped session, so one tenant's turns never lend views to another's (a lent view
is checked entry by entry against the new history anyway: a stale one costs speed, never
correctness). Bounded by the bytes of the requests whose views it keeps."""

from __future__ import annotations

from cachetools import LRUCache


class ViewMemo:
    def __init__(self, max_bytes: int) -> None:
        self.cache: LRUCache[str, tuple[int, object]] = LRUCache(
            max(1, max_bytes), getsizeof=lambda entry: max(1, entry[0])
        )

    def last(self, session: str) -> object | None:
        entry = self.cache.get(session)
        return entry[1] if entry is not None else None

    def keep(self, session: str, view: object, body_bytes: int) -> None:
        if body_bytes <= self.cache.maxsize:
            self.cache[session] = (body_bytes, view)
