"""Keys made at run time: made, rotated and revoked through the store, and followed from it.

Authentication never reads the store: the holder's `current.keys` has every key by digest
(one dict lookup). What changes it is this: a change made here is applied at once (the store
written, then read back), and every replica polls the keys' version (one read every
FOLLOW_INTERVAL_S) and reads the keys again when it moved, so a key revoked at one replica
stops working at the others within a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

from proxy.logs.limit import warn_limited
from proxy.policies.spec import ApiKey, key_digest
from proxy.policies.stored_keys import key_of, key_record, mint_secret
from proxy.policies.watch import ConfigHolder
from proxy.store.admin_records import AdminRecords
from proxy.store.base import StoreError

log = logging.getLogger("agentproxy.keys")

FOLLOW_INTERVAL_S = 0.5  # under the second a revocation may take to reach every replica


class KeyTaken(Exception):
    """A stored key has that name already (or the store holds as many as it may)."""


class RuntimeKeys:
    def __init__(self, records: AdminRecords, holder: ConfigHolder) -> None:
        self.records = records
        self._holder = holder
        self._version = -1  # none read yet
        self._stored: dict[str, ApiKey] = {}  # as last read, and as changed here since
        self._lock = asyncio.Lock()  # one read-and-apply at a time

    async def refresh(self) -> None:
        """Apply the stored keys if they changed since last read (raises StoreError)."""
        async with self._lock:
            if await self.records.keys_version() == self._version:
                return
            version, records = await self.records.stored_keys()
            stored = []
            for record in records:
                try:
                    stored.append(key_of(record))
                except (KeyError, TypeError, ValueError) as exc:  # written by another version
                    warn_limited(log, "keys.record", "stored key not used: %r", exc)
            self._stored = {key.name: key for key in stored}
            self._holder.use_stored_keys(stored)
            self._version = version

    def _apply(self, name: str, key: ApiKey | None) -> None:
        """A change this process wrote, applied here at once (the next poll reads the version
        it bumped, and every key again)."""
        if key is None:
            self._stored.pop(name, None)
        else:
            self._stored[name] = key
        self._holder.use_stored_keys(self._stored.values())

    async def follow(self, interval_s: float = FOLLOW_INTERVAL_S) -> None:
        """Keep up with the other replicas' changes (runs for the app's life)."""
        while True:
            await asyncio.sleep(interval_s)
            with contextlib.suppress(StoreError):  # warned by the store; tried again next time
                await self.refresh()

    async def create(self, key: ApiKey) -> tuple[ApiKey, str]:
        """The key stored with a new secret, and the secret (returned to the caller once)."""
        secret = mint_secret()
        made = dataclasses.replace(
            key, digest=key_digest(secret), source="store", created_at=time.time()
        )
        if not await self.records.add_key(key_record(made)):
            raise KeyTaken(key.name)
        self._apply(made.name, made)
        return made, secret

    async def rotate(self, name: str) -> tuple[ApiKey, str] | None:
        """A new secret for the stored key `name` (the old one stops working); None when no
        stored key has that name."""
        current = await self.stored(name)
        if current is None:
            return None
        secret = mint_secret()
        rotated = dataclasses.replace(current, digest=key_digest(secret), rotated_at=time.time())
        if not await self.records.replace_key(key_record(rotated)):
            return None
        self._apply(name, rotated)
        return rotated, secret

    async def revoke(self, name: str) -> bool:
        gone = await self.records.delete_key(name)
        self._apply(name, None)
        return gone

    async def stored(self, name: str) -> ApiKey | None:
        _, records = await self.records.stored_keys()
        return next((key_of(r) for r in records if r.get("name") == name), None)
