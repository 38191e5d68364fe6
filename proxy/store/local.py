"""The embedded default Store: one SQLite file under the data directory, an LRU in front.

SQLite runs in WAL mode on a single connection owned by a dedicated one-thread executor, so
the event loop never blocks on disk and statements never interleave. Every write commits
before it returns: when `put` returns, a restart (or a crash) no longer loses the blob.
The LRU (bounded by bytes) serves repeated reads of the same blob or checkpoint from memory;
it is only touched from the event loop thread.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import orjson
from cachetools import LRUCache

from proxy.store.base import BlobInfo, StoreError, snippet

T = TypeVar("T")

# Recently written blobs are the likeliest to be recalled; checkpoints are read every turn.
DEFAULT_CACHE_BYTES = 16 * 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS blobs (
    ref        TEXT PRIMARY KEY,
    session    TEXT NOT NULL,
    kind       TEXT NOT NULL,
    size       INTEGER NOT NULL,
    created_at REAL NOT NULL,
    owner      TEXT,
    meta       TEXT NOT NULL,
    data       BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS blobs_by_session ON blobs (session, created_at);
CREATE TABLE IF NOT EXISTS checkpoints (
    session TEXT NOT NULL,
    key     TEXT NOT NULL,
    data    BLOB NOT NULL,
    PRIMARY KEY (session, key)
);
CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY, at REAL NOT NULL);
"""
# Below this much free disk the store counts as full: SQLite may still fit a tiny write in
# pages it already has, but the next offloaded result would not.
MIN_FREE_BYTES = 16 * 1024 * 1024
_INFO_COLUMNS = "ref, session, kind, size, created_at, owner, meta"

CacheKey = tuple[str, ...]  # ("blob", ref) or ("checkpoint", session, key)
Cached = tuple[BlobInfo | None, bytes]


def _cached_size(value: Cached) -> int:
    return len(value[1]) + 256  # the bytes plus a rough allowance for the key and info


class LocalStore:
    shared = False  # one process owns it

    def __init__(self, path: str, *, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.path = path
        self.file = str(Path(path) / "store.sqlite3")
        self._db: sqlite3.Connection | None = None  # opened lazily, inside the worker thread
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentproxy-store")
        self._cache: LRUCache[CacheKey, Cached] = LRUCache(cache_bytes, getsizeof=_cached_size)
        self._closed = False

    @property
    def cached_bytes(self) -> int:
        return int(self._cache.currsize)

    async def open(self) -> None:
        """Optional: open now so a bad data directory shows at start-up, not on first use."""
        await self._run("open", lambda db: None)

    # -- blobs --------------------------------------------------------------------------------

    async def put(self, info: BlobInfo, data: bytes) -> None:
        def insert(db: sqlite3.Connection) -> bool:
            with db:  # one transaction, committed before put returns
                cursor = db.execute(
                    "INSERT OR IGNORE INTO blobs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (*_row_of(info), data),
                )
                return cursor.rowcount == 1

        if await self._run("put", insert):
            # Freshly offloaded content is the likeliest to be recalled soon. An existing ref
            # keeps its first info (idempotent), so only a real insert goes to the cache.
            self._remember(("blob", info.ref), (info, data))

    async def get(self, ref: str) -> tuple[BlobInfo, bytes] | None:
        cached = self._cache.get(("blob", ref))
        if cached is not None and cached[0] is not None:
            return cached[0], cached[1]

        def select(db: sqlite3.Connection) -> tuple[BlobInfo, bytes] | None:
            row = db.execute(
                f"SELECT {_INFO_COLUMNS}, data FROM blobs WHERE ref = ?", (ref,)
            ).fetchone()
            return None if row is None else (_info(row), bytes(row[7]))

        found = await self._run("get", select)
        if found is not None:
            self._remember(("blob", ref), found)
        return found

    async def blobs(self, session: str) -> list[BlobInfo]:
        def select(db: sqlite3.Connection) -> list[BlobInfo]:
            rows = db.execute(
                f"SELECT {_INFO_COLUMNS} FROM blobs WHERE session = ? ORDER BY created_at, rowid",
                (session,),
            )
            return [_info(row) for row in rows]

        return await self._run("list", select)

    async def search(self, session: str, phrase: str, limit: int = 5) -> list[tuple[BlobInfo, str]]:
        needle = phrase.lower()

        def select(db: sqlite3.Connection) -> list[tuple[BlobInfo, str]]:
            # SQLite's lower() folds ASCII only: let it pre-filter ASCII phrases inside the
            # database, and check every candidate (and non-ASCII phrases) with Python's lower().
            where = "session = ?"
            params: tuple[Any, ...] = (session,)
            if needle.isascii():
                where += " AND instr(lower(CAST(data AS TEXT)), ?) > 0"
                params += (needle,)
            found: list[tuple[BlobInfo, str]] = []
            rows = db.execute(
                f"SELECT {_INFO_COLUMNS}, data FROM blobs WHERE {where} ORDER BY rowid", params
            )
            for row in rows:
                text = bytes(row[7]).decode("utf-8", "replace")
                at = text.lower().find(needle)
                if at >= 0:
                    found.append((_info(row), snippet(text, at, len(phrase))))
                    if len(found) >= limit:
                        break
            return found

        return await self._run("search", select)

    # -- checkpoints --------------------------------------------------------------------------

    async def get_checkpoint(self, session: str, key: str) -> bytes | None:
        cache_key = ("checkpoint", session, key)
        cached = self._cache.get(cache_key)
        if cached is not None:
            return cached[1]

        def select(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                "SELECT data FROM checkpoints WHERE session = ? AND key = ?", (session, key)
            ).fetchone()
            return None if row is None else bytes(row[0])

        data = await self._run("get_checkpoint", select)
        if data is not None:
            self._remember(cache_key, (None, data))
        return data

    async def put_checkpoint(self, session: str, key: str, data: bytes) -> None:
        def upsert(db: sqlite3.Connection) -> None:
            with db:
                db.execute(
                    "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?)", (session, key, data)
                )

        await self._run("put_checkpoint", upsert)
        self._remember(("checkpoint", session, key), (None, data))

    # -- health -------------------------------------------------------------------------------

    async def probe(self) -> None:
        def write(db: sqlite3.Connection) -> None:
            free = shutil.disk_usage(self.path).free
            if free < MIN_FREE_BYTES:
                raise StoreError(
                    f"local store {self.file}: disk full ({free:,} bytes free, "
                    f"{MIN_FREE_BYTES:,} needed)"
                )
            with db:  # committed (and fsynced) like a blob: a read-only file fails here
                db.execute("INSERT OR REPLACE INTO probe VALUES (1, ?)", (time.time(),))

        await self._run("probe", write)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        try:
            await asyncio.get_running_loop().run_in_executor(self._worker, shut)
        finally:
            self._worker.shutdown(wait=False)
            self._cache.clear()

    # -- internals ----------------------------------------------------------------------------

    async def _run(self, what: str, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` on the worker thread; every failure becomes one clear StoreError."""
        if self._closed:
            raise StoreError(f"local store {self.file}: {what} after close")

        def call() -> T:
            return work(self._connection())

        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, call)
        except StoreError:
            raise
        except (sqlite3.Error, OSError, ValueError, orjson.JSONEncodeError) as exc:
            raise StoreError(f"local store {self.file}: {what} failed: {exc}") from exc

    def _connection(self) -> sqlite3.Connection:
        """Worker thread only. Opening again after a failure lets a fixed directory recover."""
        if self._db is not None:
            return self._db
        try:
            Path(self.path).mkdir(parents=True, exist_ok=True)
            # timeout: wait (instead of failing at once) when another process holds the lock.
            db = sqlite3.connect(self.file, timeout=5.0)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"local store {self.file}: cannot open: {exc}") from exc
        try:
            db.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk (fsynced) when put returns, power loss included.
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            db.close()
            raise StoreError(f"local store {self.file}: cannot open: {exc}") from exc
        self._db = db
        return db

    def _remember(self, key: CacheKey, value: Cached) -> None:
        if _cached_size(value) <= self._cache.maxsize:  # larger items would raise ValueError
            self._cache[key] = value


def _row_of(info: BlobInfo) -> tuple[Any, ...]:
    meta = orjson.dumps(info.meta).decode()
    return (info.ref, info.session, info.kind, info.size, info.created_at, info.owner, meta)


def _info(row: tuple[Any, ...]) -> BlobInfo:
    ref, session, kind, size, created_at, owner, meta = row[:7]
    return BlobInfo(ref, session, kind, size, created_at, owner, orjson.loads(meta))
