"""The sessions this process served lately, for GET /admin/sessions: who (owner, key, the name
the client knows), what (model, turns, context tokens received and sent, usage, cost), when,
the guards' state, and each one's last turns (what the stages and guards did, errors and
recoveries). Kept whatever the recording says; a recorded session's full timeline is in the
store (proxy/recording/sessions.py), and so is its row of the list (proxy/store/listing.py:
every replica's turns, after a restart too, its context tokens counted as replay counts them),
which the list shows in place of this one's.

In process memory, bounded: SESSIONS sessions, each keeping its last TURNS turns. Keyed by the
scoped session (ex.identity.session): owners never mix. Each owner has its share, as in the
store (proxy/store/shares.py): when the board is full, a new session pushes out the least
recently active session of the owner holding the most (its own, when that is itself), so one
tenant opening sessions by the thousand only cycles through its own and never empties the
board of everyone else's.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from proxy.exchange import Exchange
from proxy.sessions.main_line import CallReading, MainLine
from proxy.store.shares import session_owner

SESSIONS = 2000  # sessions remembered, at most
TURNS = 32  # turns remembered per session
EVENTS = 40  # events remembered per turn


@dataclass(slots=True)
class SessionSummary:
    session: str  # scoped: owner/name
    name: str  # as the client knows it
    owner: str
    key: str | None
    model: str = ""
    policy: str = ""
    recorded: bool = False
    turns: int = 0  # client turns: the calls that open one (a person's prompt), as the
    # index counts them (proxy/store/listing.py)
    calls: int = 0  # the agent's requests
    # Context tokens as received, estimated (four bytes a token): O(1) on the request's path.
    # A recorded session's are counted off it, by the recording's writer, for the index.
    tokens_received: int = 0
    tokens_sent: int = 0  # as sent upstream, after the rewrites
    prompt_tokens: int = 0  # what the provider reported
    completion_tokens: int = 0
    cost_usd: float | None = None  # None: no turn had a price (an unpriced model), not $0
    errors: int = 0
    first_at: float = field(default_factory=time.time)
    last_at: float = 0.0
    guard: dict[str, Any] = field(default_factory=dict)
    # Turns its recording does not hold, by why (agentproxy_recorded_turns_total's outcomes:
    # dropped, failed, stopped, skipped).
    not_recorded: dict[str, int] = field(default_factory=dict)
    timeline: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=TURNS))
    line: MainLine = field(default_factory=MainLine)  # which calls are side calls


def context_tokens(ex: Exchange) -> tuple[int, int]:
    """A call's context tokens (received, sent upstream after the rewrites), estimated at four
    bytes a token: O(1) on the request's path."""
    received = ex.client.body_bytes // 4
    return received, received if ex.dry_run else max(0, received - ex.rewrite.tokens_saved)


class SessionBoard:
    def __init__(self, sessions: int | None = None) -> None:
        self.limit = sessions or SESSIONS
        # Per owner, its sessions least recently active first.
        self._owners: dict[str, OrderedDict[str, SessionSummary]] = {}
        self._count = 0

    def saw(self, ex: Exchange, status: int, at: float, call: CallReading) -> bool:
        """A request of the session finished (answered, refused or failed) at `at`: the time
        its recording has too (the index's `first_at` and `last_at`), so a recorded session's
        row is the same, and sorts the same, whether the board or the index lists it.
        `call`: how it reads as a client turn (the recorder reads it as the recording does:
        a session's first call opens one whatever it holds, a side call never). Whether it
        is a side call."""
        identity = ex.identity
        mine = self._owners.setdefault(identity.owner, OrderedDict())
        summary = mine.get(identity.session)
        if summary is None:
            if self._count >= self.limit:
                self._evict(identity.owner)
            key = identity.key.name if identity.key is not None else None
            summary = SessionSummary(
                identity.session, identity.session_name, identity.owner, key, first_at=at
            )
            mine[identity.session] = summary
            self._count += 1
        else:
            mine.move_to_end(identity.session)
        received, sent = context_tokens(ex)
        summary.model, summary.policy = ex.alias, ex.policy.name
        summary.recorded = ex.policy.record.enabled
        opens, side = call.counted(summary.line, not summary.calls)
        summary.turns += opens
        summary.calls += 1
        summary.tokens_received += received
        summary.tokens_sent += sent
        summary.last_at = at
        summary.errors += status >= 400
        usage = ex.accounting.usage
        if usage is not None:
            summary.prompt_tokens += usage.prompt_tokens
            summary.completion_tokens += usage.completion_tokens
        if ex.accounting.cost_usd is not None:
            summary.cost_usd = (summary.cost_usd or 0.0) + ex.accounting.cost_usd
        if ex.guard_record is not None:
            summary.guard = dict(ex.guard_record)
        summary.timeline.append(
            {
                "turn": summary.turns,
                "opens": opens,
                "side": side,
                "at": round(at, 3),
                "status": status,
                "model": ex.alias,
                "context": {"received": received, "sent": sent},
                "usage": None if usage is None else usage.described(),
                "cost_usd": ex.accounting.cost_usd,
                "recoveries": ex.recovery.recoveries(),
                "events": [
                    {"stage": n.stage, "action": n.action, **n.fields} for n in ex.notes[:EVENTS]
                ],
            }
        )
        return side

    def _evict(self, newcomer: str) -> None:
        """Room for one more of `newcomer`'s: the oldest session of the owner holding the
        most, the newcomer's own when it holds its equal share or more (no scan then)."""
        share = self.limit / max(1, len(self._owners))
        mine = self._owners[newcomer]
        if len(mine) >= share:
            victim = newcomer
        else:
            victim = max(self._owners, key=lambda owner: len(self._owners[owner]))
        theirs = self._owners[victim]
        theirs.popitem(last=False)
        self._count -= 1
        if not theirs and victim != newcomer:
            del self._owners[victim]

    def unrecorded(self, session: str, outcome: str, turns: int) -> None:
        """Turns of the session its recording does not hold (a session no longer listed has
        only the metric)."""
        summary = self.get(session)
        if summary is not None:
            summary.not_recorded[outcome] = summary.not_recorded.get(outcome, 0) + turns

    def sessions(self) -> list[SessionSummary]:
        return [summary for mine in self._owners.values() for summary in mine.values()]

    def get(self, session: str) -> SessionSummary | None:
        mine = self._owners.get(session_owner(session))
        return mine.get(session) if mine is not None else None
