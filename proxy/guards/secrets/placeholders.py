"""The placeholders secrets are replaced by, and each session's map back to the secrets.

A placeholder is `«secret:<12 hex>»`, the hex an HMAC of the secret under its owner's key
(itself an HMAC of the owner under the deployment's key, kept in the store: shared_key.py):
the same secret gets the same placeholder on every turn of every session of one owner, on
every replica and after a restart (the provider's cached prefix holds), and no one without
the map can read the secret back from it. The map of each session
(scoped by its owner: a tenant is a wall) lives in memory, bounded by bytes, never in a
recording or a log.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re

OPEN, CLOSE = "«secret:", "»"
DIGITS = 12
# A placeholder in JSON text: the guillemets as they are, or as \u escapes.
IN_JSON = re.compile(rb"(?:\xc2\xab|\\u00[aA][bB])secret:([0-9a-f]{12})(?:\xc2\xbb|\\u00[bB][bB])")
IN_TEXT = re.compile(r"«secret:[0-9a-f]{12}»")
MAX_LENGTH = len(OPEN) + DIGITS + len(CLOSE)
# Drawn once per process at import, used until the store's key is read (and for good when
# the store cannot give one): `serve --workers` forks its workers after importing the app, so
# they share it.
PROCESS_KEY = os.urandom(32)


class Minter:
    """Placeholders for one process: the owners' keys derived from one key."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else PROCESS_KEY
        self._owners: dict[str, bytes] = {}

    @property
    def key(self) -> bytes:
        return self._key

    def use(self, key: bytes) -> None:
        """Mint from `key` from now on (the deployment's, read from the store)."""
        if key != self._key:
            self._key, self._owners = key, {}

    def placeholder(self, owner: str, secret: str) -> str:
        key = self._owners.get(owner)
        if key is None:
            if len(self._owners) > 4096:  # bounded: a key is cheap to derive again
                self._owners.clear()
            key = self._owners[owner] = hmac.digest(self._key, owner.encode(), hashlib.sha256)
        digest = hmac.digest(key, secret.encode(), hashlib.sha256).hex()[:DIGITS]
        return f"{OPEN}{digest}{CLOSE}"


def partial_tail(text: str) -> int:
    """Where a trailing piece of `text` that could begin a placeholder starts (the rest of it
    may come in the next stream event), or -1 when none could."""
    at = text.rfind("«", max(0, len(text) - MAX_LENGTH + 1))
    if at < 0:
        return -1
    tail = text[at:]
    if len(tail) >= MAX_LENGTH:
        return -1
    head = OPEN[: min(len(tail), len(OPEN))]
    if not tail.startswith(head):
        return -1
    rest = tail[len(OPEN) :]
    return at if all(c in "0123456789abcdef" for c in rest) else -1
