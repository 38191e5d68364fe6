"""Summaries written ahead, shared by replicas on one shared store (Redis): the crossing turn
of any replica takes the summary another wrote (prepared.py writes them, stage.py takes them).

A finished summary is kept in its session's checkpoints under SLOT (one a session, the newest
round's), so it is bounded, counted and expired as checkpoints are (store.max_mb, the owner's
share, store.session_ttl). Its session key is the owner-scoped one and the record names its
owner too: a second key sending the same session id and history never reads it. A crossing
turn with no summary of its own reads SLOT once; a store that fails or does not answer within
its timeout leaves the turn as if nothing were prepared (it summarizes inline).

Before writing one, a replica claims the round (the session and the message the summarized
stretch starts at) in the state store, atomically; another replica's claim means the summary
is theirs to write, and this one writes none. A claim that cannot be made (the store down)
does not stop the writing: two summaries cost more, none would cost the crossing turn.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from proxy.pipeline.compaction.checkpoints import Mark
from proxy.store.base import Store
from proxy.store.state import StateStore

SLOT = "compaction-prepared"  # a checkpoint key: never 16 hex digits, nor INDEX_KEY
CLAIMS = "prepare-claims"  # the state space of claims
CLAIM_TTL_S = 3600.0  # a round longer than this may be claimed again
MAX_BYTES = 256 * 1024  # a larger record is not shared (a summary is a few KB)


def replica_id() -> float:
    """This process's (this app's) name in claims: a float that Redis keeps exactly."""
    return float(random.getrandbits(52) + 1)


@dataclass(frozen=True, slots=True)
class SharedSummary:
    """A summary of messages[base:mark.length] written ahead for `owner`'s session."""

    owner: str
    base: int
    mark: Mark
    room: int
    summary: str

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "owner": self.owner,
                "base": self.base,
                "cut": self.mark.length,
                "key": self.mark.key,
                "room": self.room,
                "summary": self.summary,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> SharedSummary:
        raw = orjson.loads(data)
        mark = Mark(int(raw["cut"]), str(raw["key"]))
        return cls(str(raw["owner"]), int(raw["base"]), mark, int(raw["room"]), str(raw["summary"]))

    def fits(self, owner: str, base: int, hashes: Sequence[int]) -> bool:
        return self.owner == owner and self.base == base and self.mark.holds(hashes)


async def claim(state: StateStore, session: str, base: int, me: float) -> bool:
    """Whether this replica may write the round's summary: the first to claim it, or this one
    again (one atomic call: the claimer's name is set only when none is there)."""
    held = await state.add(CLAIMS, f"{session}|{base}", {}, first={"by": me}, ttl_s=CLAIM_TTL_S)
    return held.get("by") == me


async def publish(store: Store, session: str, shared: SharedSummary) -> bool:
    data = shared.to_bytes()
    if len(data) > MAX_BYTES:
        return False
    await store.put_checkpoint(session, SLOT, data)
    return True


async def find(store: Store, session: str) -> SharedSummary | None:
    """The session's newest summary written ahead by any replica (one store read)."""
    data = await store.get_checkpoint(session, SLOT)
    return SharedSummary.from_bytes(data) if data else None
