"""The board on a shared store: what each replica saw of the sessions no policy records, sent to
the store's index of sessions (proxy/store/listing.py, `recorded` false), so that every replica
lists every session, whichever served its calls.

A call's figures are the board's (proxy/sessions/board.py: context tokens estimated, the client
turn read as the recording reads it), taken on the request's path without a store call: they
wait here, by session, and go in one store call a moment later (LINGER_S), off the path. At most
PENDING_SESSIONS sessions wait; a call past them is left out (said, rate-limited). A store that
fails is said (rate-limited; the store's own metric counts it) and the figures wait for the
next try, never the request's failure. A recorded session's figures go with its recording
instead (proxy/recording/sessions.py). One process on a local store has no need of this: its
board lists what it served.
"""

from __future__ import annotations

import asyncio
import logging

from proxy.exchange import Exchange
from proxy.logs.limit import warn_limited
from proxy.sessions.board import context_tokens
from proxy.store.base import Store
from proxy.store.listing import Listed

log = logging.getLogger("agentproxy.sessions")

LINGER_S = 0.1  # how long the first waiting call waits for others before they are written
PENDING_SESSIONS = 10_000  # sessions whose calls wait to reach the index, at most


class SharedBoard:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._pending: dict[str, Listed] = {}  # by scoped session: its calls not written yet
        self._writing: asyncio.Task[None] | None = None

    def saw(self, ex: Exchange, status: int, at: float, opens: bool) -> None:
        """A call of a session not recorded finished at `at` (the board's time for it);
        `opens`: whether it opens a client turn (a session's first call anywhere opens one:
        the store's script sees that)."""
        identity = ex.identity
        received, sent = context_tokens(ex)
        usage = ex.accounting.usage
        call = Listed(
            identity.session,
            identity.session_name,
            identity.owner,
            identity.key.name if identity.key is not None else None,
            ex.alias,
            ex.policy.name,
            turns=int(opens),
            calls=1,
            tokens_received=received,
            tokens_sent=sent,
            prompt_tokens=usage.prompt_tokens if usage is not None else 0,
            completion_tokens=usage.completion_tokens if usage is not None else 0,
            cost_usd=ex.accounting.cost_usd,
            statuses={str(status): 1},
            first_at=at,
            last_at=at,
            recorded=False,
        )
        waiting = self._pending.get(identity.session)
        if waiting is not None:
            waiting.add(call)
        elif len(self._pending) < PENDING_SESSIONS:
            self._pending[identity.session] = call
        else:
            warn_limited(log, "board.shared.full", "sessions board: %d sessions wait for the "
                         "store; a call of another is not listed", PENDING_SESSIONS)  # fmt: skip
            return
        if self._writing is None or self._writing.done():
            self._writing = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        """What waits, to the index in one call (after a moment for more); kept for the next
        call's try when the store fails."""
        await asyncio.sleep(LINGER_S)
        entries, self._pending = list(self._pending.values()), {}
        try:
            await self.store.put_unrecorded(entries)
        except Exception as exc:
            for entry in entries:
                waiting = self._pending.get(entry.session)
                if waiting is not None:
                    waiting.add(entry)
                elif len(self._pending) < PENDING_SESSIONS:
                    self._pending[entry.session] = entry
            warn_limited(log, "board.shared", "sessions board: the store's index was not "
                         "written: %s: %s", type(exc).__name__, exc)  # fmt: skip

    async def flush(self) -> None:
        """Wait until the calls seen so far are written (a list reads its own writes)."""
        if self._writing is not None and not self._writing.done():
            await asyncio.shield(self._writing)

    async def close(self, wait_s: float = 5.0) -> None:
        if self._writing is not None and not self._writing.done():
            try:
                await asyncio.wait_for(self.flush(), wait_s)
            except TimeoutError:
                self._writing.cancel()
