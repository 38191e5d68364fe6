"""The durable index of recorded sessions: one entry per session, what GET /admin/sessions
lists of it, kept in the store beside its recording so that it outlives the process and every
replica on the store lists it.

The recording's writer (proxy/recording/sessions.py) sends each turn's figures as a `Listed`
with the turn's record blob: the backend adds them to the session's entry in the same
transaction (SQLite) or script (Redis) that writes the blob, and only when the blob is new, so
a turn is counted once whichever replica wrote it, and never when its write was refused. Turns
the recording does not hold (dropped, failed, stopped, skipped) are added on their own,
`unguarded`, to a session the store holds already.

On a shared store (Redis) the sessions no policy records are in it too (`recorded` false): each
replica's board sends what it saw of them (proxy/sessions/shared_board.py), so every replica
lists every session; such an entry has no blobs and expires store.session_ttl after its last
call.

Bounded by entries: one per session, a few hundred bytes (a status code or an
outcome is a counter, a name is what the session's identity allows); deleted with the
session's blobs (expiry, the cap, an owner's share) and expiring with them in Redis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

LISTED_MAX = 2000  # entries a listing reads, most recently active first (as the board holds);
# every owner's share of them (`fair`) when listing every owner's
_NAMES = ("name", "owner", "key", "model", "policy")
_COUNTS = ("turns", "calls", "tokens_received", "tokens_sent", "prompt_tokens", "completion_tokens")


@dataclass(slots=True)
class Listed:
    """A session's entry, or what one turn (or several) adds to it."""

    session: str  # scoped: owner/name
    name: str = ""  # as the client knows it
    owner: str = ""
    key: str | None = None
    model: str = ""
    policy: str = ""
    turns: int = 0  # client turns: the calls that open one (a person's prompt)
    calls: int = 0  # the agent's requests, each a turn record
    tokens_received: int = 0  # context tokens as received (proxy/sim/measure.py)
    tokens_sent: int = 0  # as sent upstream
    prompt_tokens: int = 0  # what the provider reported
    completion_tokens: int = 0
    cost_usd: float | None = None  # None: no call had a price (an unpriced model), not $0
    statuses: dict[str, int] = field(default_factory=dict)  # "200" -> calls
    not_recorded: dict[str, int] = field(default_factory=dict)  # outcome -> calls
    first_at: float = 0.0
    last_at: float = 0.0
    # False: a session its policy does not record, listed from what each replica's board saw
    # (a shared store only: proxy/sessions/shared_board.py); it has no blobs, and its entry
    # expires store.session_ttl after its last call.
    recorded: bool = True

    def add(self, other: Listed) -> None:
        """`other`'s turns added to these; its names when it is the more recent."""
        newer = other.last_at >= self.last_at
        for name in _NAMES:
            value = getattr(other, name)
            if value and (newer or not getattr(self, name)):
                setattr(self, name, value)
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + other.cost_usd
        _add_counts(self.statuses, other.statuses)
        _add_counts(self.not_recorded, other.not_recorded)
        if other.first_at and (not self.first_at or other.first_at < self.first_at):
            self.first_at = other.first_at
        self.last_at = max(self.last_at, other.last_at)
        if newer:
            self.recorded = other.recorded

    @property
    def errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if int(status) >= 400)

    def as_json(self) -> bytes:
        return orjson.dumps({name: getattr(self, name) for name in self.__slots__})

    @classmethod
    def from_json(cls, data: bytes) -> Listed:
        return cls(**orjson.loads(data))

    def as_hash(self) -> tuple[list[Any], list[Any], list[Any]]:
        """Redis hash fields: (names to set, integers to add, floats to add), flat pairs."""
        names: list[Any] = []
        for name in _NAMES:
            value = getattr(self, name)
            if value:
                names += [name, value]
        names += ["recorded", "1" if self.recorded else "0"]  # set by the more recent call
        counts: list[Any] = []
        for name in _COUNTS:
            if getattr(self, name):
                counts += [name, getattr(self, name)]
        for status, n in self.statuses.items():
            counts += [f"status:{status}", n]
        for outcome, n in self.not_recorded.items():
            counts += [f"not_recorded:{outcome}", n]
        floats = ["cost_usd", repr(self.cost_usd)] if self.cost_usd is not None else []
        return names, counts, floats

    @classmethod
    def from_hash(cls, session: str, raw: dict[bytes, bytes]) -> Listed:
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        listed = cls(session)
        for name in _NAMES:
            if name in fields:
                setattr(listed, name, fields[name])
        for name in _COUNTS:
            setattr(listed, name, int(fields.get(name, 0)))
        cost = fields.get("cost_usd")
        listed.cost_usd = float(cost) if cost is not None else None
        listed.first_at = float(fields.get("first_at", 0.0))
        listed.last_at = float(fields.get("last_at", 0.0))
        listed.recorded = fields.get("recorded") != "0"
        for name, value in fields.items():
            kind, _, which = name.partition(":")
            if kind == "status":
                listed.statuses[which] = int(value)
            elif kind == "not_recorded":
                listed.not_recorded[which] = int(value)
        return listed


def fair(owners: list[list[tuple[str, float]]], limit: int) -> list[str]:
    """Up to `limit` sessions from each owner's (session, last activity), most recent first:
    every owner's first, then every owner's second..., so an owner opening sessions by the
    thousand fills only what the others leave (as the board keeps its shares)."""
    ranked = [(rank, -at, session) for mine in owners for rank, (session, at) in enumerate(mine)]
    ranked.sort()
    return [session for _, _, session in ranked[:limit]]


def _add_counts(mine: dict[str, int], theirs: dict[str, int]) -> None:
    for name, n in theirs.items():
        mine[name] = mine.get(name, 0) + n
