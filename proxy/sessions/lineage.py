"""Which conversation a fingerprinted request continues.

A request without a session id the client chose is named by a fingerprint (key, end user,
system prompt, first user message: sessions/identity.py). Two independent conversations can share
all of it — the same agent started twice on the same task — and would then share loop levels,
budgets and circuits. So a fingerprint names a *family*, and each conversation in it is a
*branch* whose tip is the history of its latest request: turn N+1 is turn N plus new messages,
so a request continues the branch whose tip is the longest prefix of its history. One that
continues none (it diverged from every branch, or came back to an older point) starts a new
branch, named after its own history so that replicas name it alike.

Tips live in the state store (shared by replicas), per family, scoped by the owner like every
session's state; at most MAX_BRANCHES per family (the least recently continued go) and they
expire after a day without a request. A branch's id is sent back in `x-agentproxy-session`:
a client that sends it from then on is identified by it directly. Two requests of one family
racing on two replicas may lose one tip update: the later request then starts a new branch.

Cost: one read and one write of a small value, and the digests. A tip this process has in its
history memo (sessions/history_memo.py: the branch's last history, as the chain keeps it) costs one
C-level `==` over the shared part, which the chain then takes instead of its own, and the
history's digest extends the tip's running hash by the new messages only. Otherwise one orjson
serialization of the history and one of each candidate tip's prefix (C speed, no per-message
Python work).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import xxhash

from proxy.exchange import Exchange
from proxy.logs.limit import warn_limited
from proxy.sessions.history_memo import Checked, Digest, HistoryMemo
from proxy.sessions.identity import scoped
from proxy.store.base import StoreError
from proxy.store.state import StateStore

log = logging.getLogger("agentproxy.lineage")

SPACE = "lineage"
MAX_BRANCHES = 8
TTL_S = 24 * 3600.0

Tip = tuple[str, int, int]  # (branch name, messages in its latest request, their digest)


def digest(messages: list[dict[str, Any]]) -> int:
    """The identity of a whole history (the client serializes its past alike every turn)."""
    return xxhash.xxh3_64_intdigest(orjson.dumps(messages))


class Lineage:
    def __init__(self, state: StateStore, histories: HistoryMemo | None = None) -> None:
        self.state = state
        self.histories = histories

    async def resolve(self, ex: Exchange) -> None:
        """Narrow a fingerprinted exchange's session to the branch it continues."""
        if ex.identity.session_given:
            return
        family = ex.identity.session_name
        key = scoped(ex.identity.owner, family)
        messages = ex.messages
        try:
            tips = _decode(await self.state.get(SPACE, key))
        except StoreError as exc:  # the family name will do: as before branches existed
            warn_limited(
                log, "lineage.read", "lineage of %s unreadable: %s", ex.identity.request_id, exc
            )
            return
        branch, whole = self._continued(ex.identity.owner, tips, messages)
        ex.rewrite.checked = whole
        if branch is None:
            taken = {name for name, _, _ in tips}
            branch = family if family not in taken else f"{family}-{whole.digest.value:016x}"
        tips = [(branch, len(messages), whole.digest.value), *(t for t in tips if t[0] != branch)]
        try:
            await self.state.set(SPACE, key, _encode(tips[:MAX_BRANCHES]), ttl_s=TTL_S)
        except StoreError as exc:
            warn_limited(
                log, "lineage.save", "lineage of %s not saved: %s", ex.identity.request_id, exc
            )
        ex.identity.session_name = branch
        ex.identity.session = scoped(ex.identity.owner, branch)

    def _continued(
        self, owner: str, tips: list[Tip], messages: list[dict[str, Any]]
    ) -> tuple[str | None, Checked]:
        """The branch whose tip is the longest prefix of `messages` (the most recently
        continued of equal ones), and what was learnt of `messages` on the way."""
        count = len(messages)
        prefixes: dict[int, int] = {}
        whole: Digest | None = None
        # Longest first (a stable sort keeps the recent first among equals): the first match.
        for name, length, tip in sorted(tips, key=lambda t: -t[1]):
            if length > count:
                continue
            seen = self.histories.get(scoped(owner, name)) if self.histories else None
            if (
                seen is not None
                and seen.digest is not None
                and seen.digest.count == length == len(seen.messages)
                and seen.digest.value == tip
                and seen.messages == messages[:length]
            ):  # the tip as this process last saw it: the new messages are all to hash
                checked = Checked(messages, seen.digest.extended(messages[length:]), seen.messages)
                return name, checked
            if length not in prefixes:
                if length == count:
                    whole = whole or Digest.of(messages)
                    prefixes[length] = whole.value
                else:
                    prefixes[length] = digest(messages[:length])
            if prefixes[length] == tip:
                return name, Checked(messages, whole or Digest.of(messages))
        return None, Checked(messages, whole or Digest.of(messages))


def _encode(tips: list[Tip]) -> bytes:
    return orjson.dumps(tips)


def _decode(raw: bytes | None) -> list[Tip]:
    if not raw:
        return []
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    if not isinstance(value, list):
        return []
    return [
        (t[0], t[1], t[2])
        for t in value
        if isinstance(t, list)
        and len(t) == 3
        and isinstance(t[0], str)
        and isinstance(t[1], int)
        and isinstance(t[2], int)
    ]
