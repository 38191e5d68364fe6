"""The one seam through which every rewrite, decision and failure becomes visible: a note for
the `x-agentproxy-applied` header, a counter, and a line in the event log, always together;
and, once a request is done, its turn: to the sessions board (GET /admin/sessions) and, for a
session whose policy records it, to the store (proxy/recording/sessions.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from proxy.exchange import Exchange
from proxy.logs.limit import warn_limited
from proxy.metrics import GUARDS, Metrics
from proxy.recording.conversation import Conversation
from proxy.recording.events import EventLog
from proxy.recording.sessions import Finished, TurnWriter, read_call
from proxy.sessions.board import SessionBoard
from proxy.sessions.main_line import CallReading
from proxy.sessions.shared_board import SharedBoard

log = logging.getLogger("agentproxy.recording")

# Stages whose events have metrics of their own, with richer labels (retries by model and
# class, fallbacks by source and target, affinity moves, upstream errors by reason, the
# guard's by action and rule): not counted again here.
COUNTED_ELSEWHERE = frozenset(
    {"retry", "fallback", "routing", "circuit", "stream", "usage", "guard"}
)


_UNREAD = CallReading(True, True, lambda: (None, None))  # a main call, a prompt


class Recorder:
    def __init__(self, metrics: Metrics, events: EventLog) -> None:
        self.metrics = metrics
        self.events = events
        self.board: SessionBoard | None = None  # set by the app: what /admin/sessions lists
        self.turns: TurnWriter | None = None  # set by the app: recorded sessions' writer
        # Set by the app on a shared store: the sessions not recorded, to the store's index.
        self.shared_board: SharedBoard | None = None
        # Set by the app, by wire name: how its bodies read (whether a call opens a client
        # turn, counted on the board as the recording counts it).
        self.conversations: Mapping[str, Conversation] = {}

    def record(self, ex: Exchange, stage: str, action: str, **fields: Any) -> None:
        ex.note(stage, action, **fields)
        metrics = self.metrics
        if stage not in COUNTED_ELSEWHERE:
            counter = metrics.decisions if stage in GUARDS else metrics.rewrites
            metrics.child(counter, stage, action).inc()
        before, after = fields.get("tokens_before"), fields.get("tokens_after")
        if isinstance(before, int) and isinstance(after, int) and before > after:
            metrics.child(metrics.tokens_saved, stage).inc(before - after)
            ex.rewrite.tokens_saved += before - after
        self.events.write(ex, stage, action, fields)

    def finished(self, ex: Exchange, status: int, record: Finished | None) -> None:
        """A request is done, whatever its outcome: its turn to the board, and to its
        session's recording when `record` (queued: written off the request's path)."""
        if self.board is not None:  # at the recording's time: one row whichever lists it
            at = record.at if record is not None else time.time()
            reading = self._read(ex)
            side = self.board.saw(ex, status, at, reading)
            if record is None and self.shared_board is not None and not ex.policy.record.enabled:
                # As read, not as this board counted it: its first call of the session may be
                # another replica's later one (the index counts the session's first once).
                self.shared_board.saw(ex, status, at, reading.prompt and not side)
        if record is not None and self.turns is not None:
            self.turns.submit(record)

    def _read(self, ex: Exchange) -> CallReading:
        """The call as a client turn reads (whether it opens one, is a side call); a reading
        that fails (a body its wire's Conversation cannot read) counts it as a main call that
        opens one, said, never the request's failure."""
        conversation = self.conversations.get(ex.client.wire)
        if conversation is None:
            return _UNREAD
        try:
            return read_call(ex, conversation)
        except Exception as exc:
            warn_limited(log, "board.opens", "sessions board: a call's client turn was not "
                         "read: %s: %s", type(exc).__name__, exc)  # fmt: skip
            return _UNREAD

    def turns_unrecorded(self, session: str, outcome: str, turns: int) -> None:
        """Turns of a session that its recording lost (dropped, failed) or left out (stopped,
        skipped): shown on the board with the session."""
        if self.board is not None:
            self.board.unrecorded(session, outcome, turns)

    def recording_stopped(self, ex: Exchange, fields: dict[str, Any]) -> None:
        """A session's recording reached record.max_mb_per_session: it ends here."""
        self.record(ex, "record", "stopped", **fields)
