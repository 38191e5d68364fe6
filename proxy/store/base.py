"""The Store protocol: narrow enough for the embedded store and a Redis backend alike.

Everything is scoped by session. Blobs are content-addressed (the same content in the same
session always gets the same ref), written before anything is removed from a context, and
readable only by the key that created them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import xxhash

if TYPE_CHECKING:
    from proxy.store.listing import Listed


class StoreError(Exception):
    """The store could not do what was asked; callers degrade instead of failing requests."""


@dataclass(frozen=True, slots=True)
class BlobInfo:
    ref: str
    session: str
    kind: str  # "tool_result", "tool_arguments", "history"
    size: int  # bytes
    created_at: float
    owner: str | None = None  # API key name that created it; None when the proxy is open
    meta: dict[str, Any] = field(default_factory=dict)  # tool name, call id, message count...


# A recorded session's blobs (proxy/recording/sessions.py): kept with the session's archive,
# expiring with it, but no archive themselves: never searched, listed or served as one.
RECORD_PART = "record_part"
RECORD_TURN = "record_turn"
RECORDING_KINDS = frozenset({RECORD_PART, RECORD_TURN})


def content_ref(session: str, kind: str, data: bytes) -> str:
    """Deterministic: one session's identical content always maps to the same reference."""
    digest = xxhash.xxh3_128(session.encode() + b"\0" + kind.encode() + b"\0" + data)
    return f"ap_{digest.hexdigest()[:24]}"


SNIPPET_CHARS = 600


def snippet(text: str, at: int, length: int) -> str:
    """The lines around a search hit at `at`: the line before, the hit's line(s), the line
    after; whole lines read better than a window cut mid-word. Capped at SNIPPET_CHARS."""
    line_start = text.rfind("\n", 0, at) + 1
    start = text.rfind("\n", 0, max(line_start - 1, 0)) + 1 if line_start else 0
    line_end = text.find("\n", at + length)
    end = len(text) if line_end < 0 else text.find("\n", line_end + 1)
    end = len(text) if end < 0 else end
    if end - start > SNIPPET_CHARS:  # very long lines: centre on the hit instead
        start = max(0, at - SNIPPET_CHARS // 3)
        end = start + SNIPPET_CHARS
    return text[start:end]


class Store(Protocol):
    # True when other processes write it too: a mutable value (a checkpoint index) cached in
    # memory may be stale, so it must be read again.
    shared: bool

    async def put(self, info: BlobInfo, data: bytes) -> None:
        """Durable when it returns. Writing an existing ref again is a no-op."""
        ...

    async def put_many(
        self, items: list[tuple[BlobInfo, bytes]], listed: Mapping[str, Listed] | None = None
    ) -> None:
        """Several blobs of one owner at once (one transaction, one round trip): a recording's
        turns. `listed`, by the ref of a blob among them: what it adds to its session's entry
        in the index of recorded sessions (proxy/store/listing.py), added only when that blob
        is new."""
        ...

    async def put_listed(self, entries: list[Listed]) -> None:
        """Added to the entries of sessions the store holds (others are let go): turns a
        recording does not hold."""
        ...

    async def put_unrecorded(self, entries: list[Listed]) -> None:
        """Added to the entries of sessions no policy records, held or not (`recorded`
        false): what each replica's board saw, on a shared store (proxy/sessions/
        shared_board.py). Such an entry has no blobs, counts toward no size and expires
        store.session_ttl after its last write."""
        ...

    async def listed(self, owner: str | None, limit: int) -> list[Listed]:
        """The owner's recorded sessions (None: every owner's), most recently active first."""
        ...

    async def listed_one(self, session: str) -> Listed | None:
        """The scoped session's entry."""
        ...

    async def get(self, ref: str) -> tuple[BlobInfo, bytes] | None:
        """Any session's blob; callers check `info.session` / `info.owner` before handing out."""
        ...

    async def blobs(self, session: str) -> list[BlobInfo]: ...

    async def search(self, session: str, phrase: str, limit: int = 5) -> list[tuple[BlobInfo, str]]:
        """Blobs containing `phrase` (case-insensitive), each with a snippet around it."""
        ...

    async def get_checkpoint(self, session: str, key: str) -> bytes | None: ...

    async def put_checkpoint(self, session: str, key: str, data: bytes) -> None: ...

    async def probe(self) -> None:
        """Raise StoreError unless a small write succeeds now (a full or read-only store)."""
        ...

    async def close(self) -> None: ...
