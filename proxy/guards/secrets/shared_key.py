"""The deployment's placeholder key: every replica sharing a store, and every restart, mints
the same placeholder for a secret (placeholders.py), so a session the load balancer moves
between replicas sends the provider the same prefix and its prompt cache holds.

The key is 32 random bytes kept in the store beside the admin records (Redis: under the
prefix at `guard:placeholder_key`, no expiry; local: `admin.sqlite3` under store.path, 0600):
the first process to start puts its own there (drawn at import), every other reads it, before
the first request. A store that does not answer at start leaves the process its own key and a
warning, and is asked again every few seconds until it answers: then this replica's
placeholders change once, to everyone's. A shared store is asked again every minute after
that, the key in use put back if it went (Redis restarted without its data, or evicted it), so
a replica started later never draws another while the others mint from this one. The key is
never logged.
"""

from __future__ import annotations

import asyncio
import logging

from proxy.guards.secrets.placeholders import Minter
from proxy.store.admin_records import AdminRecords
from proxy.store.base import StoreError

log = logging.getLogger("agentproxy.guard")
KEY_BYTES = 32
RETRY_S = 5.0  # until the store has answered once
KEEP_S = 60.0  # a shared store, after that


class SharedKey:
    """Gives `minter` the key kept in the store."""

    def __init__(self, records: AdminRecords, minter: Minter) -> None:
        self.records = records
        self.minter = minter
        self.loaded = False  # the minter has the store's key
        self.answered = False  # the store has answered, with a key fit to use or not
        self._warned = False

    async def load(self) -> bool:
        """Whether the minter now has the store's key (else it keeps the one it had). The key
        it has is the one put there when the store holds none."""
        try:
            key = await self.records.placeholder_key(self.minter.key)
        except StoreError as exc:
            if not self.loaded:
                self._warn(
                    "could not be read from the store (%s); placeholders are minted from this "
                    "process's own until it is (tried again every %.0f s), so they differ "
                    "from other replicas'",
                    exc, RETRY_S,
                )  # fmt: skip
            return self.loaded  # a key read once stays: a store down keeps it
        self.answered = True
        if len(key) < KEY_BYTES:  # not one this proxy put there: never mint from a weak key
            self._warn(
                "kept in the store is %d bytes, not %d; placeholders are minted from this "
                "process's own (delete it while no replica runs to have a new one)",
                len(key), KEY_BYTES,
            )  # fmt: skip
            return self.loaded
        if key != self.minter.key:
            if self.loaded:  # another replica's went in after this one's went missing
                log.warning("guard: the placeholder key in the store changed; minting from it")
            elif self._warned:
                log.info("guard: placeholders are minted from the store's key from now on")
            self.minter.use(key)
        self.loaded = True
        return True

    async def follow(self, keep: bool) -> None:
        """Asks again every RETRY_S until the store has answered; then, when `keep` (a shared
        store), every KEEP_S for good."""
        while keep or not self.answered:
            await asyncio.sleep(KEEP_S if self.answered else RETRY_S)
            await self.load()

    def _warn(self, what: str, *args: object) -> None:
        if not self._warned:  # once: the store's own warnings say when it is down
            self._warned = True
            log.warning("guard: the placeholder key " + what, *args)
