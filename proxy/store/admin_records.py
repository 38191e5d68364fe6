"""What the admin surface keeps: the keys made at run time and the audit of admin actions;
and the deployment's placeholder key (the guard's, proxy/guards/secrets/shared_key.py).

Beside the blobs, in the same place: a SQLite file of its own under store.path (`local`:
every worker of one `serve` reads it), or Redis (`redis`: every replica). Keys carry a version
bumped by each change: a replica polls it (one read) and reads the keys again only when it
moved. Audit entries get increasing ids (pages start past one) and are kept under the
store's retention: none older than store.session_ttl_s, and at most AUDIT_MAX_ENTRIES.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import orjson

from proxy.store.base import StoreError
from proxy.store.files import private_dir, private_file

T = TypeVar("T")
Order = Literal["newest", "oldest"]
AUDIT_MAX_ENTRIES = 100_000  # ~30 MB at ~300 bytes an entry
MAX_STORED_KEYS = 10_000  # run-time keys; more is refused (the store's records stay bounded)


class AdminRecords(Protocol):
    async def keys_version(self) -> int:
        """Bumped by every change to the stored keys (0: none ever made)."""
        ...

    async def stored_keys(self) -> tuple[int, list[dict[str, Any]]]:
        """The version and every stored key's record."""
        ...

    async def add_key(self, record: dict[str, Any]) -> bool:
        """False when a key of that name is stored already (or MAX_STORED_KEYS are)."""
        ...

    async def replace_key(self, record: dict[str, Any]) -> bool:
        """False when no key of that name is stored."""
        ...

    async def delete_key(self, name: str) -> bool: ...

    async def append_audit(self, entry: dict[str, Any], keep_s: float) -> int:
        """The entry's id; entries older than keep_s go."""
        ...

    async def audit(self, after: int | None, limit: int, order: Order) -> list[dict[str, Any]]:
        """Up to `limit` entries past id `after` in that order (newest: ids below it)."""
        ...

    async def placeholder_key(self, drawn: bytes) -> bytes:
        """The key the guard's placeholders derive from: `drawn` kept if none is yet, else
        the one kept (every replica, every restart gets the first one drawn)."""
        ...

    async def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS stored_keys (name TEXT PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS keys_version (id INTEGER PRIMARY KEY CHECK (id = 1), n INTEGER);
INSERT OR IGNORE INTO keys_version VALUES (1, 0);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, entry BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_time ON audit (at);
CREATE TABLE IF NOT EXISTS placeholder_key (id INTEGER PRIMARY KEY CHECK (id = 1), key BLOB);
"""


class LocalAdminRecords:
    """In `<store.path>/admin.sqlite3` (0600). Admin actions are rare and small: each runs in
    a thread on one connection (a lock keeps them in turn), committed before it returns."""

    def __init__(self, path: str) -> None:
        self.file = str(Path(path) / "admin.sqlite3")
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            private_dir(Path(self.file).parent)
            private_file(self.file)
            db = sqlite3.connect(self.file, timeout=5.0, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
            db.commit()
            self._db = db
        return self._db

    async def _run(self, what: str, work: Callable[[sqlite3.Connection], T]) -> T:
        def job() -> T:
            with self._lock:
                db = self._connect()
                try:
                    result = work(db)
                    db.commit()
                    return result
                except BaseException:
                    db.rollback()
                    raise

        try:
            return await asyncio.to_thread(job)
        except sqlite3.Error as exc:
            raise StoreError(f"admin records {self.file}: {what} failed: {exc}") from exc

    async def keys_version(self) -> int:
        return await self._run("keys_version", _version)

    async def stored_keys(self) -> tuple[int, list[dict[str, Any]]]:
        def read(db: sqlite3.Connection) -> tuple[int, list[dict[str, Any]]]:
            rows = db.execute("SELECT record FROM stored_keys ORDER BY name").fetchall()
            return _version(db), [orjson.loads(row[0]) for row in rows]

        return await self._run("stored_keys", read)

    async def add_key(self, record: dict[str, Any]) -> bool:
        def add(db: sqlite3.Connection) -> bool:
            (count,) = db.execute("SELECT count(*) FROM stored_keys").fetchone()
            if count >= MAX_STORED_KEYS:
                return False
            cursor = db.execute(
                "INSERT OR IGNORE INTO stored_keys VALUES (?, ?)",
                (record["name"], orjson.dumps(record)),
            )
            return _bumped(db, cursor.rowcount)

        return await self._run("add_key", add)

    async def replace_key(self, record: dict[str, Any]) -> bool:
        def replace(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "UPDATE stored_keys SET record = ? WHERE name = ?",
                (orjson.dumps(record), record["name"]),
            )
            return _bumped(db, cursor.rowcount)

        return await self._run("replace_key", replace)

    async def delete_key(self, name: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            cursor = db.execute("DELETE FROM stored_keys WHERE name = ?", (name,))
            return _bumped(db, cursor.rowcount)

        return await self._run("delete_key", delete)

    async def append_audit(self, entry: dict[str, Any], keep_s: float) -> int:
        def append(db: sqlite3.Connection) -> int:
            cursor = db.execute(
                "INSERT INTO audit (at, entry) VALUES (?, ?)", (entry["at"], orjson.dumps(entry))
            )
            added = int(cursor.lastrowid or 0)
            db.execute("DELETE FROM audit WHERE at < ?", (time.time() - keep_s,))
            db.execute("DELETE FROM audit WHERE id <= ?", (added - AUDIT_MAX_ENTRIES,))
            return added

        return await self._run("append_audit", append)

    async def audit(self, after: int | None, limit: int, order: Order) -> list[dict[str, Any]]:
        def read(db: sqlite3.Connection) -> list[dict[str, Any]]:
            if order == "newest":
                where, direction = "id < ?", "DESC"
                bound = after if after is not None else 2**62
            else:
                where, direction = "id > ?", "ASC"
                bound = after if after is not None else 0
            rows = db.execute(
                f"SELECT id, entry FROM audit WHERE {where} ORDER BY id {direction} LIMIT ?",
                (bound, limit),
            ).fetchall()
            return [{"id": row[0], **orjson.loads(row[1])} for row in rows]

        return await self._run("audit", read)

    async def placeholder_key(self, drawn: bytes) -> bytes:
        def kept(db: sqlite3.Connection) -> bytes:
            db.execute("INSERT OR IGNORE INTO placeholder_key VALUES (1, ?)", (drawn,))
            return bytes(db.execute("SELECT key FROM placeholder_key WHERE id = 1").fetchone()[0])

        return await self._run("placeholder_key", kept)

    async def close(self) -> None:
        def close() -> None:
            with self._lock:
                if self._db is not None:
                    self._db.close()
                    self._db = None

        await asyncio.to_thread(close)


def _version(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT n FROM keys_version WHERE id = 1").fetchone()[0])


def _bumped(db: sqlite3.Connection, changed: int) -> bool:
    if changed:
        db.execute("UPDATE keys_version SET n = n + 1 WHERE id = 1")
    return bool(changed)
