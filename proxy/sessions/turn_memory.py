"""Memory across turns: each session's record of its last turn, so that the next turn's view
is built only from what is new (a turn re-sends the whole history), and of what the proxy
relayed to it that a next turn may need back (Anthropic's signed thinking, which some clients
drop: proxy/wire/anthropic/thinking.py).

What a record holds is its wire's (proxy/wire/<format>/memory.py: what its view lends the next
turn's, what its answers left); this is where records live. Keyed by the owner and the session,
so one tenant's turn never reads nor replaces another's under the same session id (a lent
record is checked entry by entry against the new history anyway: a stale one costs speed, never
correctness); a record of another kind (the session changed wire) is not recalled. The two
records are kept apart: a turn replaces the last turn's, an answer the last answers'. Bounded by
the bytes of the requests and answers whose records it keeps."""

from __future__ import annotations

from typing import NamedTuple, TypeVar

from cachetools import LRUCache

from proxy.sessions.identity import scoped

Memory = TypeVar("Memory")


class Kept(NamedTuple):
    """A session's records, each with the bytes it stands for."""

    turn_bytes: int = 0
    turn: object = None  # its last turn's
    relayed_bytes: int = 0
    relayed: object = None  # what its last answers left


_NONE = Kept()


class TurnMemory:
    def __init__(self, max_bytes: int) -> None:
        # By the scoped session (owner and name), as every memo the idle sweep forgets.
        self.cache: LRUCache[str, Kept] = LRUCache(
            max(1, max_bytes), getsizeof=lambda kept: max(1, kept.turn_bytes + kept.relayed_bytes)
        )

    def recall(self, owner: str, session: str, kind: type[Memory]) -> Memory | None:
        """The owner's record of the session's last turn, if it is of `kind`."""
        kept = self.cache.get(scoped(owner, session))
        return kept.turn if kept is not None and isinstance(kept.turn, kind) else None

    def keep(self, owner: str, session: str, memory: object, request_bytes: int) -> None:
        """The session's last turn is now this one."""
        key = scoped(owner, session)
        kept = self.cache.get(key, _NONE)
        self._put(key, kept._replace(turn_bytes=request_bytes, turn=memory))

    def relayed(self, owner: str, session: str, kind: type[Memory]) -> Memory | None:
        """The owner's record of what was relayed to the session, if it is of `kind`."""
        kept = self.cache.get(scoped(owner, session))
        return kept.relayed if kept is not None and isinstance(kept.relayed, kind) else None

    def keep_relayed(self, owner: str, session: str, memory: object, answer_bytes: int) -> None:
        """What was relayed to the session is now this (its last turn's record stays)."""
        key = scoped(owner, session)
        kept = self.cache.get(key, _NONE)
        self._put(key, kept._replace(relayed_bytes=answer_bytes, relayed=memory))

    def _put(self, key: str, kept: Kept) -> None:
        """The session's records, unless larger than all (the former then stay)."""
        if kept.turn_bytes + kept.relayed_bytes <= self.cache.maxsize:
            self.cache[key] = kept
