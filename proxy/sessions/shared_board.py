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

import logging

from proxy.exchange import Exchange
from proxy.sessions.board import context_tokens
from proxy.store.base import Store
from proxy.store.listing import Listed
from proxy.store.listing_batch import ListingBatch

log = logging.getLogger("agentproxy.sessions")

LINGER_S = 0.1  # how long the first waiting call waits for others before they are written
PENDING_SESSIONS = 10_000  # sessions whose calls wait to reach the index, at most


class SharedBoard:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._batch = ListingBatch(
            store.put_unrecorded, log, "sessions board", PENDING_SESSIONS, LINGER_S
        )

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
        self._batch.add(call)

    async def flush(self) -> None:
        """Wait until the calls seen so far are written (a list reads its own writes)."""
        await self._batch.flush()

    async def close(self, wait_s: float = 5.0) -> None:
        await self._batch.close(wait_s)
