"""Memory across turns: each session's record of its last turn, so that the next turn's view
is built only from what is new (a turn re-sends the whole history).

What a record holds is its wire's (proxy/wire/<format>/memory.py: what its view lends the next
turn's); this is where records live. Keyed by the owner and the session, so one tenant's turn
never reads nor replaces another's under the same session id (a lent record is checked entry by
entry against the new history anyway: a stale one costs speed, never correctness); a record of
another kind (the session changed wire) is not recalled. Bounded by the bytes of the requests
whose records it keeps."""

from __future__ import annotations

from typing import TypeVar

from cachetools import LRUCache

from proxy.sessions.identity import scoped

Memory = TypeVar("Memory")


class TurnMemory:
    def __init__(self, max_bytes: int) -> None:
        # By the scoped session (owner and name), as every memo the idle sweep forgets.
        self.cache: LRUCache[str, tuple[int, object]] = LRUCache(
            max(1, max_bytes), getsizeof=lambda entry: max(1, entry[0])
        )

    def recall(self, owner: str, session: str, kind: type[Memory]) -> Memory | None:
        """The owner's record of the session's last turn, if it is of `kind`."""
        entry = self.cache.get(scoped(owner, session))
        return entry[1] if entry is not None and isinstance(entry[1], kind) else None

    def keep(self, owner: str, session: str, memory: object, request_bytes: int) -> None:
        """The session's last turn is now this one (a record larger than all: not kept)."""
        if request_bytes <= self.cache.maxsize:
            self.cache[scoped(owner, session)] = (request_bytes, memory)
