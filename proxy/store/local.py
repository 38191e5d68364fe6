"""The embedded default Store: one SQLite file under the data directory, an LRU in front.

SQLite runs in WAL mode on a single connection owned by a dedicated one-thread executor, so
the event loop never blocks on disk and statements never interleave. Every write commits
before it returns: when `put` returns, a restart (or a crash) no longer loses the blob.
The LRU (bounded by bytes) serves repeated reads of the same blob or checkpoint from memory;
it is only touched from the event loop thread.

Retention (proxy/store/retention.py): triggers keep a `sessions` table (last activity and bytes
per session) as blobs and checkpoints are written; a collection deletes whole sessions in
short transactions (other work interleaves), then gives the pages back with an incremental
vacuum and truncates the write-ahead log. The size cap counts the pages in use.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import orjson
from cachetools import LRUCache

from proxy.store.base import RECORDING_KINDS, BlobInfo, StoreError, snippet
from proxy.store.files import narrowed, private_dir, private_file
from proxy.store.listing import Listed, fair
from proxy.store.retention import KICK_AT, LOW_WATER, Collected, Pressure, StoreStats
from proxy.store.shares import OwnerFull, owner_full_message, session_owner

T = TypeVar("T")
log = logging.getLogger("agentproxy.store")

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
CREATE TABLE IF NOT EXISTS sessions (
    session     TEXT PRIMARY KEY,
    last_active REAL NOT NULL,
    bytes       INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_activity ON sessions (last_active);
CREATE TRIGGER IF NOT EXISTS blob_added AFTER INSERT ON blobs BEGIN
    INSERT INTO sessions VALUES (NEW.session, NEW.created_at, length(NEW.data))
    ON CONFLICT (session) DO UPDATE SET
        bytes = bytes + length(NEW.data), last_active = max(last_active, NEW.created_at);
END;
CREATE TRIGGER IF NOT EXISTS checkpoint_added AFTER INSERT ON checkpoints BEGIN
    INSERT INTO sessions VALUES (NEW.session, {now}, length(NEW.data))
    ON CONFLICT (session) DO UPDATE SET
        bytes = bytes + length(NEW.data), last_active = max(last_active, {now});
END;
CREATE TRIGGER IF NOT EXISTS checkpoint_changed AFTER UPDATE OF data ON checkpoints BEGIN
    UPDATE sessions SET bytes = bytes + length(NEW.data) - length(OLD.data),
        last_active = max(last_active, {now})
    WHERE session = NEW.session;
END;
CREATE TABLE IF NOT EXISTS owners (
    owner TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS owner_session_added AFTER INSERT ON sessions BEGIN
    INSERT INTO owners VALUES ({new_owner}, NEW.bytes)
    ON CONFLICT (owner) DO UPDATE SET bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER IF NOT EXISTS owner_session_grown AFTER UPDATE OF bytes ON sessions BEGIN
    UPDATE owners SET bytes = bytes + NEW.bytes - OLD.bytes WHERE owner = {new_owner};
END;
CREATE TRIGGER IF NOT EXISTS owner_session_removed AFTER DELETE ON sessions BEGIN
    UPDATE owners SET bytes = bytes - OLD.bytes WHERE owner = {old_owner};
END;
"""
# A session's owner is its scoped key up to the first "/" ("" for an unscoped one).
_OWNER_OF = "substr({s}, 1, instr({s}, '/') - 1)"
_SCHEMA = (
    _SCHEMA.replace("{now}", "((julianday('now') - 2440587.5) * 86400.0)")
    .replace("{new_owner}", _OWNER_OF.format(s="NEW.session"))
    .replace("{old_owner}", _OWNER_OF.format(s="OLD.session"))
)
# The index of recorded sessions (proxy/store/listing.py): made by the first recording, so a
# store that records nothing holds no pages for it.
_LISTED_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS listed (session TEXT PRIMARY KEY, owner TEXT NOT NULL, "
    "last_at REAL NOT NULL, entry BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS listed_by_owner ON listed (owner, last_at)",
)
# Sessions written before the sessions table existed: their blobs date them.
_BACKFILL = """
INSERT OR IGNORE INTO sessions
    SELECT session, max(created_at), sum(length(data)) FROM blobs GROUP BY session;
INSERT INTO sessions
    SELECT session, ?, sum(length(data)) FROM checkpoints WHERE true GROUP BY session
    ON CONFLICT (session) DO UPDATE SET bytes = bytes + excluded.bytes;
"""
# Owners' bytes, for a store written before they were counted.
_BACKFILL_OWNERS = f"""
INSERT OR REPLACE INTO owners
    SELECT {_OWNER_OF.format(s="session")}, sum(bytes) FROM sessions GROUP BY 1
"""
PAGE_BYTES = 4096  # SQLite's default page size
COLLECT_BATCH = 256  # sessions deleted per transaction
JOB_S = 0.05  # longest a collection holds the store's worker thread at a time
# How long an owner at its share with only live sessions is refused without looking again for
# idle sessions of its own to evict.
OWNER_RETRY_S = 1.0
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

    backend = "local"

    def __init__(
        self,
        path: str,
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_bytes: int | None = None,
        owner_share: float | None = None,
        live_s: float = 3600.0,
    ) -> None:
        self.path = path
        self.file = str(Path(path) / "store.sqlite3")
        self.max_bytes = max_bytes
        # The log is checkpointed past its limit, after the transaction that crossed it, and
        # keeps its file at the limit: room for up to three times that.
        self.pressure = Pressure(max_bytes, reserve=3 * self._wal_limit())
        # What one owner may hold (proxy/store/shares.py); None: no limit.
        self.owner_share = owner_share if max_bytes is not None else None
        self.live_s = live_s
        # Told of the sessions a write evicted to keep its owner within its share.
        self.on_owner_evicted: Callable[[str, list[str]], None] | None = None
        # Owners whose last refusal found none of their sessions idle, until when (monotonic):
        # meanwhile their writes are refused after one lookup, without looking for sessions
        # to evict (a sort of all the owner's sessions, on the thread every request shares).
        self._owner_stuck: dict[str, float] = {}
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
        if self.pressure.at_cap(len(data)) and not await self._run(
            "put", partial(_has, ref=info.ref)
        ):
            await self.pressure.room_for(len(data), f"local store {self.file}")
        self.pressure.claim(len(data))
        owner = session_owner(info.session)
        share = self.owner_share
        limit = self.pressure.share_of(share) if share is not None and owner else None
        live_after = time.time() - self.live_s
        may_evict = self._owner_stuck.get(owner, 0.0) <= time.monotonic()

        def insert(db: sqlite3.Connection) -> tuple[bool | None, list[str]]:
            """(inserted, or None when refused for the owner's share; sessions evicted)."""
            with _immediate(db):  # one transaction, committed before put returns
                evicted: list[str] = []
                if limit is not None:
                    excess = _owner_excess(db, owner, len(data), limit, info.ref)
                    if excess > 0 and may_evict:  # down to LOW_WATER of the share
                        need = excess + int(limit * (1 - LOW_WATER))
                        evicted = _evict_owner(db, owner, need, live_after)
                        excess = _owner_excess(db, owner, len(data), limit, info.ref)
                    if excess > 0:
                        return None, evicted  # the evictions stand: they were due
                cursor = db.execute(
                    "INSERT OR IGNORE INTO blobs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (*_row_of(info), data),
                )
                return cursor.rowcount == 1, evicted

        inserted, evicted = await self._run("put", insert)
        if evicted:
            self._forget(evicted)
            if self.on_owner_evicted is not None:
                self.on_owner_evicted(owner, evicted)
        if inserted is None:
            if may_evict and not evicted:
                self._owner_stuck[owner] = time.monotonic() + OWNER_RETRY_S
            self.pressure.release(len(data))
            assert limit is not None
            raise OwnerFull(owner_full_message(f"local store {self.file}", owner, limit))
        if inserted:
            # Freshly offloaded content is the likeliest to be recalled soon. An existing ref
            # keeps its first info (idempotent), so only a real insert goes to the cache.
            self._remember(("blob", info.ref), (info, data))

    async def put_many(
        self, items: list[tuple[BlobInfo, bytes]], listed: Mapping[str, Listed] | None = None
    ) -> None:
        """Several blobs of one owner in one transaction, not fsynced: a recording's turns.
        All or none: refused as a whole (OwnerFull) when they would pass the owner's share.
        `listed`: each new turn's figures, added to its session's entry in that transaction."""
        if not items:
            return
        size = sum(len(data) for _, data in items)
        if self.pressure.at_cap(size):
            await self.pressure.room_for(size, f"local store {self.file}")
        self.pressure.claim(size)
        owner = session_owner(items[0][0].session)
        share = self.owner_share
        limit = self.pressure.share_of(share) if share is not None and owner else None
        live_after = time.time() - self.live_s
        rows = [(*_row_of(info), data) for info, data in items]

        def insert(db: sqlite3.Connection) -> tuple[list[bool] | None, list[str]]:
            # Not fsynced (WAL: durable at the next checkpoint): a recording lost to a power
            # cut loses history of what happened, never what a context needs back.
            db.execute("PRAGMA synchronous=NORMAL")
            try:
                return write(db)
            finally:
                db.execute("PRAGMA synchronous=FULL")

        def write(db: sqlite3.Connection) -> tuple[list[bool] | None, list[str]]:
            with _immediate(db):
                evicted: list[str] = []
                fresh = [not _has(db, info.ref) for info, _ in items]
                adding = sum(len(data) for (_, data), new in zip(items, fresh, strict=True) if new)
                if limit is not None and adding:
                    excess = _owner_excess(db, owner, adding, limit, "")
                    if excess > 0:
                        need = excess + int(limit * (1 - LOW_WATER))
                        evicted = _evict_owner(db, owner, need, live_after)
                        excess = _owner_excess(db, owner, adding, limit, "")
                    if excess > 0:
                        return None, evicted
                db.executemany("INSERT OR IGNORE INTO blobs VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                turns = [
                    listed[info.ref]
                    for (info, _), new in zip(items, fresh, strict=True)
                    if new and listed and info.ref in listed
                ]
                if turns:
                    _list(db, turns, held_only=False)
                return fresh, evicted

        inserted, evicted = await self._run("put", insert)
        if evicted:
            self._forget(evicted)
            if self.on_owner_evicted is not None:
                self.on_owner_evicted(owner, evicted)
        if inserted is None:
            self.pressure.release(size)
            assert limit is not None
            raise OwnerFull(owner_full_message(f"local store {self.file}", owner, limit))

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
            where = f"session = ? AND kind NOT IN {tuple(sorted(RECORDING_KINDS))!r}"
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

    # -- the index of recorded sessions (proxy/store/listing.py) -------------------------------

    async def put_listed(self, entries: list[Listed]) -> None:
        if entries:
            await self._run("put_listed", partial(_listed_in_transaction, entries=entries))

    async def put_unrecorded(self, entries: list[Listed]) -> None:
        """Never sent: one process owns this store, and its board lists its sessions no
        policy records (proxy/sessions/shared_board.py is for a shared store)."""
        raise NotImplementedError("the local store lists unrecorded sessions from the board")

    async def listed(self, owner: str | None, limit: int) -> list[Listed]:
        def select(db: sqlite3.Connection) -> list[Listed]:
            if not _has_table(db, "listed"):
                return []
            owners = [owner]
            if owner is None:  # each owner's most recent, then as many as the limit takes
                owners = [row[0] for row in db.execute("SELECT DISTINCT owner FROM listed")]
            mine = {
                who: db.execute(
                    "SELECT session, last_at, entry FROM listed WHERE owner = ? "
                    "ORDER BY last_at DESC LIMIT ?",
                    (who, limit),
                ).fetchall()
                for who in owners
            }
            picked = set(fair([[(s, at) for s, at, _ in rows] for rows in mine.values()], limit))
            found = [
                Listed.from_json(bytes(entry))
                for rows in mine.values()
                for session, _, entry in rows
                if session in picked
            ]
            return sorted(found, key=lambda entry: entry.last_at, reverse=True)

        return await self._run("listed", select)

    async def listed_one(self, session: str) -> Listed | None:
        def select(db: sqlite3.Connection) -> Listed | None:
            if not _has_table(db, "listed"):
                return None
            row = db.execute("SELECT entry FROM listed WHERE session = ?", (session,)).fetchone()
            return None if row is None else Listed.from_json(bytes(row[0]))

        return await self._run("listed", select)

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
        self.pressure.claim(len(data))  # small: never waits for room

        def upsert(db: sqlite3.Connection) -> None:
            with db:  # an upsert, not a REPLACE: the size triggers see the old row
                db.execute(
                    "INSERT INTO checkpoints VALUES (?, ?, ?) "
                    "ON CONFLICT (session, key) DO UPDATE SET data = excluded.data",
                    (session, key, data),
                )

        await self._run("put_checkpoint", upsert)
        self._remember(("checkpoint", session, key), (None, data))

    # -- retention ----------------------------------------------------------------------------

    async def touch(self, sessions: Mapping[str, float]) -> None:
        rows = [(at, session) for session, at in sessions.items()]

        def update(db: sqlite3.Connection) -> None:
            # Not fsynced: a touch lost to a power cut only makes a session look older.
            db.execute("PRAGMA synchronous=NORMAL")
            try:
                with db:
                    db.executemany(
                        "UPDATE sessions SET last_active = max(last_active, ?) WHERE session = ?",
                        rows,
                    )
            finally:
                db.execute("PRAGMA synchronous=FULL")

        if rows:
            await self._run("touch", update)

    async def collect(self, *, expire_before: float, live_after: float) -> Collected:
        """A few worker jobs, each bounded in time (JOB_S) so the requests' own store work
        queued behind them never waits long; a large backlog takes more of them."""
        before = await self._run("collect", _used_bytes)
        expired: list[str] = []
        while True:
            batch, more = await self._run("collect", partial(_expire, before=expire_before))
            expired += batch
            self._forget(batch)
            if not more:
                break
        evicted: list[str] = []
        over_cap = False
        if self.pressure.limit is not None:
            evict = partial(_evict, limit=self.pressure.limit, live_after=live_after)
            while True:
                batch, over_cap, more = await self._run("collect", evict)
                evicted += batch
                self._forget(batch)
                if not more:
                    break
        if await self._run("collect", self._worth_giving_back):
            await self._give_back()
        after, payload = await self._run("collect", _sizes)
        self.pressure.collected(after, payload)
        return Collected(tuple(expired), tuple(evicted), before, after, over_cap)

    async def stats(self, *, live_after: float) -> StoreStats:
        def read(db: sqlite3.Connection) -> StoreStats:
            sessions, live, payload, oldest = db.execute(
                "SELECT count(*), count(*) FILTER (WHERE last_active >= ?), "
                "coalesce(sum(bytes), 0), min(last_active) FROM sessions",
                (live_after,),
            ).fetchone()
            blobs = db.execute("SELECT count(*) FROM blobs").fetchone()[0]
            checkpoints = db.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
            files = {"file": self.file, "file_bytes": _file_bytes(self.file)}
            return StoreStats(
                "local", sessions, live, blobs, checkpoints, payload, _used_bytes(db),
                self.max_bytes, oldest, files,
            )  # fmt: skip

        return await self._run("stats", read)

    def _worth_giving_back(self, db: sqlite3.Connection) -> bool:
        """Free pages are reused by the next writes: they go back to the file system only
        when they are a quarter of the file, or the file is over the cap."""
        pages, free, size = (
            _pragma(db, name) for name in ("page_count", "freelist_count", "page_size")
        )
        over = self.max_bytes is not None and pages * size > self.max_bytes
        return free > 0 and (over or free * 4 >= pages)

    async def _give_back(self) -> None:
        """Freed pages back to the file system, and the write-ahead log truncated. Each step
        moves at most what the log may hold, and checkpoints it: the log never outgrows its
        limit (on disk, it counts against the cap too)."""
        # Moving a page rewrites its parent and pointer-map pages too: a quarter of the limit.
        step = partial(_vacuum, pages=max(1, self._wal_limit() // PAGE_BYTES // 4))
        while await self._run("vacuum", step):
            pass
        await self._run(
            "vacuum", lambda db: db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        )

    def _wal_limit(self) -> int:
        """How large the write-ahead log may grow between checkpoints: a small share of the
        cap (its pages are counted twice on disk until then), at most SQLite's default."""
        if self.max_bytes is None:
            return 1000 * PAGE_BYTES
        return max(16 * PAGE_BYTES, min(1000 * PAGE_BYTES, self.max_bytes // 32))

    def _forget(self, sessions: list[str]) -> None:
        """Drop removed sessions' entries from the read cache (event loop thread only)."""
        gone = set(sessions)
        for key, (info, _) in list(self._cache.items()):
            session = info.session if info is not None else key[1]
            if session in gone:
                del self._cache[key]

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
            private_dir(self.path)
            # SQLite creates its -wal and -shm with the database file's modes.
            private_file(self.file)
            for companion in ("-wal", "-shm"):  # from before files were private
                narrowed(self.file + companion)
            # timeout: wait (instead of failing at once) when another process holds the lock.
            db = sqlite3.connect(self.file, timeout=5.0)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"local store {self.file}: cannot open: {exc}") from exc
        try:
            _incremental_vacuum(db, self.file)
            db.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk (fsynced) when put returns, power loss included.
            db.execute("PRAGMA synchronous=FULL")
            wal = self._wal_limit()
            db.execute(f"PRAGMA wal_autocheckpoint={wal // PAGE_BYTES}")
            db.execute(f"PRAGMA journal_size_limit={wal}")
            # Some builds zero every freed page (secure_delete=ON): a collection would write
            # all it deletes through the log. FAST still clears what stays in b-tree pages,
            # and freed pages leave the file with the incremental vacuum.
            db.execute("PRAGMA secure_delete=FAST")
            new_sessions_table = not _has_table(db, "sessions")
            new_owners_table = not _has_table(db, "owners")
            db.executescript(_SCHEMA)
            if new_sessions_table:
                with db:
                    for statement in _BACKFILL.strip().split(";\n"):
                        db.execute(statement, (time.time(),) if "?" in statement else ())
            if new_owners_table:
                with db:
                    db.execute(_BACKFILL_OWNERS)
        except sqlite3.Error as exc:
            db.close()
            raise StoreError(f"local store {self.file}: cannot open: {exc}") from exc
        self._db = db
        return db

    def _remember(self, key: CacheKey, value: Cached) -> None:
        if _cached_size(value) <= self._cache.maxsize:  # larger items would raise ValueError
            self._cache[key] = value


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction that holds the write lock from its first read: what it selects
    is still true when it deletes (another process touching a session waits)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.rollback()
        raise
    db.commit()


def _expire(db: sqlite3.Connection, before: float) -> tuple[list[str], bool]:
    """Delete sessions last active before `before`, for up to JOB_S; and whether more are."""
    expired: list[str] = []
    give_up = time.monotonic() + JOB_S
    while time.monotonic() < give_up:
        with _immediate(db):
            rows = db.execute(
                "SELECT session FROM sessions WHERE last_active < ? ORDER BY last_active LIMIT ?",
                (before, COLLECT_BATCH),
            ).fetchall()
            batch = [row[0] for row in rows]
            _delete(db, batch)
        expired += batch
        if len(batch) < COLLECT_BATCH:
            return expired, False
    return expired, True


def _evict(db: sqlite3.Connection, limit: int, live_after: float) -> tuple[list[str], bool, bool]:
    """From KICK_AT of `limit`, delete the least recently active sessions that are not live,
    down to LOW_WATER of it, for up to JOB_S. (evicted, at the limit with live sessions only,
    more to do)."""
    start, target = int(limit * KICK_AT), int(limit * LOW_WATER)
    evicted: list[str] = []
    give_up = time.monotonic() + JOB_S
    while time.monotonic() < give_up:
        used = _used_bytes(db)
        if used < start and (not evicted or used <= target):
            return evicted, False, False
        with _immediate(db):
            rows = db.execute(
                "SELECT session, bytes FROM sessions WHERE last_active < ? "
                "ORDER BY last_active LIMIT ?",
                (live_after, COLLECT_BATCH),
            ).fetchall()  # read to the end: a statement left open would block the commit
            batch: list[str] = []
            freed = 0
            for session, size in rows:
                batch.append(session)
                freed += size
                if freed >= used - target:
                    break
            _delete(db, batch)
        if not batch:
            return evicted, True, False
        evicted += batch
    return evicted, False, True


def _owner_excess(db: sqlite3.Connection, owner: str, size: int, limit: int, ref: str) -> int:
    """How many bytes past `limit` the owner would hold after writing `size` more (0 or
    less: it fits). A ref already stored adds nothing, so it always fits."""
    row = db.execute("SELECT bytes FROM owners WHERE owner = ?", (owner,)).fetchone()
    excess = (int(row[0]) if row else 0) + size - limit
    return 0 if excess > 0 and _has(db, ref) else excess


# An owner's sessions are the keys from "<owner>/" up to "<owner>0" ("0" follows "/"): a
# range of the primary key, no index of their own. Sorted only when the owner is at its share.
_OWNER_SESSIONS = (
    "SELECT session, bytes FROM sessions WHERE session >= ? AND session < ? "
    "AND last_active < ? ORDER BY last_active LIMIT ?"
)


def _evict_owner(db: sqlite3.Connection, owner: str, need: int, live_after: float) -> list[str]:
    """Inside the caller's transaction: delete the owner's least recently active sessions
    that are not live until `need` bytes are freed (or none is left)."""
    span = (f"{owner}/", f"{owner}0")
    rows = db.execute(_OWNER_SESSIONS, (*span, live_after, COLLECT_BATCH)).fetchall()
    batch: list[str] = []
    freed = 0
    for session, size in rows:
        if freed >= need:
            break
        batch.append(session)
        freed += size
    _delete(db, batch)
    return batch


def _listed_in_transaction(db: sqlite3.Connection, entries: list[Listed]) -> None:
    with _immediate(db):
        _list(db, entries, held_only=True)


def _list(db: sqlite3.Connection, turns: list[Listed], held_only: bool) -> None:
    """Inside the caller's transaction: each turn's figures added to its session's entry;
    `held_only`: only to a session the store holds (an entry goes with its session's rows)."""
    for statement in _LISTED_SCHEMA:
        db.execute(statement)
    for turn in turns:
        if (
            held_only
            and not db.execute(
                "SELECT 1 FROM sessions WHERE session = ?", (turn.session,)
            ).fetchone()
        ):
            continue
        row = db.execute("SELECT entry FROM listed WHERE session = ?", (turn.session,)).fetchone()
        entry = Listed.from_json(bytes(row[0])) if row else Listed(turn.session)
        entry.add(turn)
        db.execute(
            "INSERT OR REPLACE INTO listed VALUES (?, ?, ?, ?)",
            (turn.session, session_owner(turn.session), entry.last_at, entry.as_json()),
        )


def _delete(db: sqlite3.Connection, sessions: list[str]) -> None:
    tables = ("blobs", "checkpoints", "listed", "sessions")
    for table in tables if _has_table(db, "listed") else tables[:2] + tables[3:]:
        db.executemany(f"DELETE FROM {table} WHERE session = ?", [(s,) for s in sessions])


def _used_bytes(db: sqlite3.Connection) -> int:
    pages, free, size = (
        _pragma(db, name) for name in ("page_count", "freelist_count", "page_size")
    )
    return (pages - free) * size


def _has(db: sqlite3.Connection, ref: str) -> bool:
    return db.execute("SELECT 1 FROM blobs WHERE ref = ?", (ref,)).fetchone() is not None


def _sizes(db: sqlite3.Connection) -> tuple[int, int]:
    """The pages in use, and the payload they hold (blobs and checkpoints as written)."""
    payload = db.execute("SELECT coalesce(sum(bytes), 0) FROM sessions").fetchone()[0]
    return _used_bytes(db), int(payload)


def _pragma(db: sqlite3.Connection, name: str) -> int:
    return int(db.execute(f"PRAGMA {name}").fetchall()[0][0])


def _vacuum(db: sqlite3.Connection, pages: int) -> bool:
    """Give back free pages, `pages` at a time, for up to JOB_S; whether any are left."""
    give_up = time.monotonic() + JOB_S
    while _pragma(db, "freelist_count"):
        if time.monotonic() >= give_up:
            return True
        db.execute(f"PRAGMA incremental_vacuum({pages})").fetchall()
        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    return False


def _incremental_vacuum(db: sqlite3.Connection, file: str) -> None:
    """Free pages can only be given back with auto_vacuum=INCREMENTAL: set on a new file;
    an older store is converted once (a full VACUUM, which rewrites it)."""
    if _pragma(db, "auto_vacuum") == 2:
        return
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")
    if _has_table(db, "blobs"):
        log.warning("local store %s: converting to incremental vacuum (once)", file)
        db.execute("VACUUM")


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    found = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return found.fetchone() is not None


def _file_bytes(file: str) -> int:
    """The database file with its write-ahead log and index: what it takes on disk."""
    total = 0
    for suffix in ("", "-wal", "-shm"):
        with suppress(OSError):
            total += os.path.getsize(file + suffix)
    return total


def _row_of(info: BlobInfo) -> tuple[Any, ...]:
    meta = orjson.dumps(info.meta).decode()
    return (info.ref, info.session, info.kind, info.size, info.created_at, info.owner, meta)


def _info(row: tuple[Any, ...]) -> BlobInfo:
    ref, session, kind, size, created_at, owner, meta = row[:7]
    return BlobInfo(ref, session, kind, size, created_at, owner, orjson.loads(meta))
