"""Redis: the store and the shared state of proxies running as several replicas.

Every key starts with the configured prefix:

    <p>blob:<ref>             hash {info, data}       an offloaded payload or archived history
    <p>blobs:<session>        list of refs            a session's blobs, in write order
    <p>ckpt:<session>         hash {key: data}        compaction checkpoints, their index, and the
                                                      summary written ahead (shared_prepared.py)
    <p>state:<space>:<key>    string                  loop levels, failing sessions
    <p>count:<space>:<key>    hash {name: float}      budget counters (HINCRBYFLOAT in Lua)
    <p>pub:<space>            hash {field: "exp val"} open circuits, deployment facts: every replica
                                                      should know them
    <p>rate:<subject>         hash {at, r, t}         rate-limit buckets (redis_windows.py)
    <p>lease:<subject>        sorted set              rate-limit slots in flight -> their expiry
    <p>probe                  string, 60 s TTL        the write check of start-up and /readyz
    <p>sessions               sorted set              session -> last activity (retention)
    <p>sizes                  hash {session: bytes}   what each session's blobs and checkpoints hold
    <p>bytes                  string                  their total: what store.max_mb counts
    <p>owners                 hash {owner: bytes}     what each owner's sessions hold (shares)
    <p>owner:<owner>          sorted set              the owner's sessions -> last activity
    <p>listing:<session>      hash                    a session's entry in the index of sessions
                                                      (store/listing.py): a recorded one's, or
                                                      one no policy records (recorded: 0)
    <p>listed:<owner>         sorted set              the owner's listed sessions -> the
                                                      last turn's time
    <p>listed-owners          set                     the owners with listed sessions

An owner's bytes are the sizes of the sessions in its sorted set: a session joins it (and its
size the count) on its first write or activity, and leaves it when dropped; one written before
owners were counted is counted from its next request on.

A session's keys expire `store.session_ttl` after its last activity (its touches refresh them
now and then); a collection also deletes whole sessions least recently active first while the
total is over the cap, each in one script that checks the session is still that old. Needs
Redis 6.2 or later (ZADD GT).

Blobs are content-addressed and immutable, so a blob read once is cached in process memory;
checkpoint indexes change, so they are always read from Redis. When Redis does not answer
within `timeout_s`, the operation fails with a StoreError and, for one second, so does every
other without waiting: the request goes on without its state (callers degrade) instead of
queueing behind a dead connection. Durability is Redis' own: run it with appendonly for blobs
to survive a Redis restart.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis
from cachetools import LRUCache
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from proxy.policies.spec import StoreSettings
from proxy.redaction import redact_url
from proxy.store.base import RECORDING_KINDS, BlobInfo, StoreError, snippet
from proxy.store.listing import Listed, fair
from proxy.store.redis_pipe import ScriptPipe
from proxy.store.retention import KICK_AT, LOW_WATER, Collected, Pressure, StoreStats
from proxy.store.shares import OwnerFull, owner_full_message, session_owner

T = TypeVar("T")
log = logging.getLogger("agentproxy.store")

PAUSE_AFTER_FAILURE_S = 1.0  # fail fast this long after Redis stopped answering
PROBE_TTL_MS = 60_000  # the write-check key tidies itself up

# Write a blob once: the first writer's info stays (refs are content addresses). Refused (-1)
# when it would take its owner past its share (a limit of 0: none).
# KEYS: blob, session's list, sessions, sizes, bytes, owners, owner's sessions.
# ARGV: info, data, ref, ttl, session, now, owner, owner's limit.
_PUT_BLOB = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local limit = tonumber(ARGV[8])
if limit > 0 and tonumber(redis.call('HGET', KEYS[6], ARGV[7]) or '0') + #ARGV[2] > limit then
  return -1
end
local held = tonumber(redis.call('HGET', KEYS[4], ARGV[5]) or '0')
redis.call('HSET', KEYS[1], 'info', ARGV[1], 'data', ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[3])
local ttl = tonumber(ARGV[4])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
redis.call('ZADD', KEYS[3], 'GT', ARGV[6], ARGV[5])
redis.call('HINCRBY', KEYS[4], ARGV[5], #ARGV[2])
redis.call('INCRBY', KEYS[5], #ARGV[2])
local fresh = redis.call('ZADD', KEYS[7], 'GT', ARGV[6], ARGV[5]) == 1
redis.call('HINCRBY', KEYS[6], ARGV[7], #ARGV[2] + (fresh and held or 0))
return 1
"""
# A turn's figures added to its session's entry (proxy/store/listing.py), from ARGV[i]:
# first_at, last_at, then counted lists of pairs: names set (by the more recent turn),
# integers and floats added. The entry expires with the session's blobs.
_LIST_FUNCTION = """
local function list(entry, mine, owners, owner, session, ttl, i)
  local first, last = ARGV[i], ARGV[i + 1]
  local was = redis.call('HGET', entry, 'first_at')
  if tonumber(first) > 0 and (not was or tonumber(was) > tonumber(first)) then
    redis.call('HSET', entry, 'first_at', first)
  end
  was = redis.call('HGET', entry, 'last_at')
  local newer = not was or tonumber(was) <= tonumber(last)
  if newer then redis.call('HSET', entry, 'last_at', last) end
  i = i + 2
  local n = tonumber(ARGV[i])
  i = i + 1
  for _ = 1, n do
    if newer or redis.call('HEXISTS', entry, ARGV[i]) == 0 then
      redis.call('HSET', entry, ARGV[i], ARGV[i + 1])
    end
    i = i + 2
  end
  n = tonumber(ARGV[i])
  i = i + 1
  for _ = 1, n do
    redis.call('HINCRBY', entry, ARGV[i], ARGV[i + 1])
    i = i + 2
  end
  n = tonumber(ARGV[i])
  i = i + 1
  for _ = 1, n do
    redis.call('HINCRBYFLOAT', entry, ARGV[i], ARGV[i + 1])
    i = i + 2
  end
  redis.call('ZADD', mine, 'GT', last, session)
  redis.call('SADD', owners, owner)
  if ttl > 0 then redis.call('PEXPIRE', entry, ttl) end
end
"""
# A turn's record blob, written as _PUT_BLOB writes it, and (only when written) its figures
# added to its session's entry: a turn is counted once, and never when refused.
# KEYS: _PUT_BLOB's, then the entry, the owner's recorded sessions, the owners with some.
# ARGV: _PUT_BLOB's, then the figures (_LIST_FUNCTION's, from ARGV[9]).
_PUT_TURN = (
    _LIST_FUNCTION
    + _PUT_BLOB.rstrip().removesuffix("return 1")
    + "list(KEYS[8], KEYS[9], KEYS[10], ARGV[7], ARGV[5], tonumber(ARGV[4]), 9)\nreturn 1\n"
)
# Figures of turns not recorded, added to the entry of a session the store holds.
# KEYS: sessions, the entry, the owner's recorded sessions, the owners with some.
# ARGV: session, ttl, owner, figures.
_LIST = (
    _LIST_FUNCTION
    + """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
list(KEYS[2], KEYS[3], KEYS[4], ARGV[3], ARGV[1], tonumber(ARGV[2]), 4)
return 1
"""
)
# Figures of a session no policy records (every replica's board sends them): its entry, with no
# blobs and counted toward no size, expiring a TTL after its last write; the session's first
# call opens a client turn whichever replica served it; the owner's listed sessions whose last
# call is older than the TTL (their entries have expired) are let go.
# KEYS: the entry, the owner's listed sessions, the owners with some.
# ARGV: session, ttl, owner, figures.
_LIST_UNRECORDED = (
    _LIST_FUNCTION
    + """
local ttl = tonumber(ARGV[2])
list(KEYS[1], KEYS[2], KEYS[3], ARGV[3], ARGV[1], ttl, 4)
if tonumber(redis.call('HGET', KEYS[1], 'turns') or '0') < 1 then
  redis.call('HSET', KEYS[1], 'turns', 1)
end
if ttl > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (tonumber(ARGV[5]) - ttl / 1000))
end
return 1
"""
)
# KEYS: checkpoints hash, sessions, sizes, bytes, owners, owner's sessions.
# ARGV: key, data, ttl, session, now, owner.
_PUT_CHECKPOINT = """
local grown = #ARGV[2] - redis.call('HSTRLEN', KEYS[1], ARGV[1])
local held = tonumber(redis.call('HGET', KEYS[3], ARGV[4]) or '0')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
redis.call('ZADD', KEYS[2], 'GT', ARGV[5], ARGV[4])
redis.call('HINCRBY', KEYS[3], ARGV[4], grown)
redis.call('INCRBY', KEYS[4], grown)
local fresh = redis.call('ZADD', KEYS[6], 'GT', ARGV[5], ARGV[4]) == 1
redis.call('HINCRBY', KEYS[5], ARGV[6], grown + (fresh and held or 0))
return 1
"""
# A session's activity: only one with data is recorded. Its keys' expiry is pushed back when
# a sixteenth of the TTL has passed since it last was, not on every touch.
# KEYS: sessions, session's list, checkpoints hash, owner's sessions, sizes, owners, entry.
# ARGV: session, now, ttl, blob key prefix, owner.
_TOUCH = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], 'GT', ARGV[2], ARGV[1])
if redis.call('ZADD', KEYS[4], 'GT', ARGV[2], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[6], ARGV[5], redis.call('HGET', KEYS[5], ARGV[1]) or '0')
end
local ttl = tonumber(ARGV[3])
if ttl <= 0 then return 1 end
local left = math.max(redis.call('PTTL', KEYS[2]), redis.call('PTTL', KEYS[3]))
if left >= 0 and left > ttl - ttl / 16 then return 1 end
for _, ref in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  redis.call('PEXPIRE', ARGV[4] .. ref, ttl)
end
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
redis.call('PEXPIRE', KEYS[7], ttl)
return 2
"""
# Delete a whole session, if it is still last active before ARGV[2] (a request may have come).
# KEYS: sessions, sizes, bytes, session's list, checkpoints hash, owners, owner's sessions,
# entry, owner's recorded sessions, owners with some.
# ARGV: session, before, blob key prefix, owner. Returns the bytes freed, or -1 when kept.
_DROP = """
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if at and tonumber(at) >= tonumber(ARGV[2]) then return -1 end
for _, ref in ipairs(redis.call('LRANGE', KEYS[4], 0, -1)) do
  redis.call('UNLINK', ARGV[3] .. ref)
end
redis.call('UNLINK', KEYS[4], KEYS[5], KEYS[8])
redis.call('ZREM', KEYS[9], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
local size = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('DECRBY', KEYS[3], size)
if redis.call('ZREM', KEYS[7], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[6], ARGV[4], -size)
end
return size
"""
# Counters: ARGV = ttl_ms, number of amounts, amount pairs..., then set-if-absent pairs.
_ADD = """
local n = tonumber(ARGV[2])
local i = 3
for _ = 1, n do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
  i = i + 2
end
while i < #ARGV do
  redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  i = i + 2
end
local ttl = tonumber(ARGV[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return redis.call('HGETALL', KEYS[1])
"""


class RedisConnection:
    """One client (a connection pool) shared by the store and the state, and the fail-fast
    switch both go through."""

    def __init__(self, settings: StoreSettings) -> None:
        url = settings.url  # the loader resolved os.environ/ and required it for redis
        assert url, "store.url is required for the redis backend"
        self.where = redact_url(url)
        self.prefix = settings.prefix
        self.timeout_s = settings.timeout_s
        self.ttl_ms = int(settings.session_ttl_s * 1000)
        # Typed Any: redis-py's stubs say "bytes | str" everywhere; with decode_responses off
        # every reply is bytes.
        self.client: Any = aioredis.Redis.from_url(
            url,
            socket_timeout=settings.timeout_s,
            socket_connect_timeout=settings.timeout_s,
            retry=Retry(NoBackoff(), 0),  # the proxy decides what a failure means
            decode_responses=False,
        )
        self.put_blob: Any = self.client.register_script(_PUT_BLOB)
        self.put_turn: Any = self.client.register_script(_PUT_TURN)
        self.list: Any = self.client.register_script(_LIST)
        self.list_unrecorded: Any = self.client.register_script(_LIST_UNRECORDED)
        self.put_checkpoint: Any = self.client.register_script(_PUT_CHECKPOINT)
        self.touch: Any = self.client.register_script(_TOUCH)
        self.drop: Any = self.client.register_script(_DROP)
        self.add: Any = self.client.register_script(_ADD)
        # The rate limits' scripts, one round trip a batch on a connection of their own.
        self.pipe = ScriptPipe(self.client, settings.timeout_s)
        self._paused_until = 0.0
        self._down_since: float | None = None

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def ttl_for(self, ttl_s: float | None) -> int:
        """Milliseconds a key lives: its own TTL, else store.session_ttl; 0 (kept) for an
        infinite one."""
        if ttl_s is None:
            return self.ttl_ms
        return 0 if math.isinf(ttl_s) else int(ttl_s * 1000)

    async def run(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        self.check(what)
        try:
            # Socket timeouts bound each command; this bounds a script or pipeline as a whole
            # (asyncio.timeout, not wait_for: no task of its own, ~15 µs less per operation).
            async with asyncio.timeout(self.timeout_s * 2):
                result = await operation()
        except (RedisError, OSError, TimeoutError) as exc:
            raise self.failed(what, exc) from exc
        self.answered()
        return result

    def check(self, what: str) -> None:
        """Raises StoreError at once while Redis is taken for down."""
        if time.monotonic() < self._paused_until:
            raise StoreError(f"redis {self.where}: {what} skipped, not answering")

    def failed(self, what: str, exc: BaseException) -> StoreError:
        """What an operation that failed raises; every other fails fast for a while."""
        now = time.monotonic()
        self._paused_until = now + PAUSE_AFTER_FAILURE_S
        if self._down_since is None:
            self._down_since = now
            log.warning("redis %s not answering (%s): going on without it", self.where, exc)
        return StoreError(f"redis {self.where}: {what} failed: {exc}")

    def answered(self) -> None:
        if self._down_since is not None:
            took = time.monotonic() - self._down_since
            log.warning("redis %s answering again after %.1f s", self.where, took)
            self._down_since = None

    async def close(self) -> None:
        await self.pipe.close()
        await self.client.aclose()


class RedisStore:
    """The Store protocol over Redis; see the module docstring for the key layout."""

    backend = "redis"
    shared = True  # other processes write too: never trust a cached mutable value

    def __init__(
        self,
        redis: RedisConnection,
        cache_bytes: int = 16 * 1024 * 1024,
        *,
        max_bytes: int | None = None,
        owner_share: float | None = None,
        live_s: float = 3600.0,
    ) -> None:
        self.redis = redis
        self.max_bytes = max_bytes
        self.pressure = Pressure(max_bytes)
        # What one owner may hold (proxy/store/shares.py); None: no limit.
        self.owner_share = owner_share if max_bytes is not None else None
        self.live_s = live_s
        # Told of the sessions a write evicted to keep its owner within its share.
        self.on_owner_evicted: Callable[[str, list[str]], None] | None = None
        self._cache: LRUCache[str, tuple[BlobInfo, bytes]] = LRUCache(
            cache_bytes, getsizeof=lambda entry: len(entry[1]) + 256
        )

    async def put(self, info: BlobInfo, data: bytes) -> None:
        r = self.redis
        if self.pressure.at_cap(len(data)) and not await r.run(
            "put", lambda: r.client.exists(r.key("blob", info.ref))
        ):
            await self.pressure.room_for(len(data), f"redis {r.where}")
        self.pressure.claim(len(data))
        owner = session_owner(info.session)
        share = self.owner_share
        limit = self.pressure.share_of(share) if share is not None and owner else 0
        keys = [
            r.key("blob", info.ref), r.key("blobs", info.session), *self._index(),
            *self._owner_index(owner),
        ]  # fmt: skip
        args = [
            _info_bytes(info), data, info.ref, r.ttl_ms, info.session, info.created_at,
            owner, limit,
        ]  # fmt: skip
        written = await r.run("put", lambda: r.put_blob(keys=keys, args=args))
        if written < 0:  # the owner's share is full: its own idle sessions go first
            await self._evict_owner(owner, len(data), limit)
            written = await r.run("put", lambda: r.put_blob(keys=keys, args=args))
        if written < 0:
            self.pressure.release(len(data))
            raise OwnerFull(owner_full_message(f"redis {r.where}", owner, limit))
        if written:
            self._remember(info, data)  # an existing ref keeps its first info

    async def put_many(
        self, items: list[tuple[BlobInfo, bytes]], listed: Mapping[str, Listed] | None = None
    ) -> None:
        """Several blobs in one round trip (a pipeline of the same script as `put`): a
        recording's turns. One refused for its owner's share refuses the rest after it.
        `listed`: each turn's figures, added to its session's entry by the script that writes
        the turn's record (_PUT_TURN)."""
        if not items:
            return
        r = self.redis
        size = sum(len(data) for _, data in items)
        if self.pressure.at_cap(size):
            await self.pressure.room_for(size, f"redis {r.where}")
        self.pressure.claim(size)
        owner = session_owner(items[0][0].session)
        share = self.owner_share
        limit = self.pressure.share_of(share) if share is not None and owner else 0

        async def write() -> list[int]:
            async with r.client.pipeline(transaction=False) as pipe:
                for info, data in items:
                    keys = [
                        r.key("blob", info.ref), r.key("blobs", info.session), *self._index(),
                        *self._owner_index(owner),
                    ]  # fmt: skip
                    args = [
                        _info_bytes(info), data, info.ref, r.ttl_ms, info.session,
                        info.created_at, owner, limit,
                    ]  # fmt: skip
                    turn = listed.get(info.ref) if listed else None
                    if turn is None:
                        await r.put_blob(keys=keys, args=args, client=pipe)
                        continue
                    keys += self._listing_keys(info.session, owner)
                    args += _figures(turn)
                    await r.put_turn(keys=keys, args=args, client=pipe)
                written: list[int] = await pipe.execute()
                return written

        written = await r.run("put", write)
        if any(w < 0 for w in written):  # the owner's idle sessions go first, as for `put`
            await self._evict_owner(owner, size, limit)
            written = await r.run("put", write)  # those written already answer 0
        if any(w < 0 for w in written):
            self.pressure.release(size)
            raise OwnerFull(owner_full_message(f"redis {r.where}", owner, limit))

    async def put_listed(self, entries: list[Listed]) -> None:
        # To a session the store holds (its key in `sessions`), as its recording's figures.
        r = self.redis
        await self._list(entries, "put_listed", r.list, (r.key("sessions"),))

    async def put_unrecorded(self, entries: list[Listed]) -> None:
        # Whether the store holds the session or not: a session no policy records.
        await self._list(entries, "put_unrecorded", self.redis.list_unrecorded, ())

    async def _list(
        self, entries: list[Listed], name: str, script: Any, first_keys: tuple[str, ...]
    ) -> None:
        """Each entry's figures added to its session's entry by `script`, in one pipeline."""
        if not entries:
            return
        r = self.redis

        async def write() -> None:
            async with r.client.pipeline(transaction=False) as pipe:
                for entry in entries:
                    owner = session_owner(entry.session)
                    keys = [*first_keys, *self._listing_keys(entry.session, owner)]
                    args = [entry.session, r.ttl_ms, owner, *_figures(entry)]
                    await script(keys=keys, args=args, client=pipe)
                await pipe.execute()

        await r.run(name, write)

    async def listed(self, owner: str | None, limit: int) -> list[Listed]:
        r = self.redis

        async def read() -> tuple[list[str], list[Any]]:
            if owner is not None:
                names = [
                    m.decode()
                    for m in await r.client.zrevrange(r.key("listed", owner), 0, limit - 1)
                ]
            else:  # each owner's most recent, then as many of each as the limit takes
                owners = sorted(m.decode() for m in await r.client.smembers(r.key("listed-owners")))
                async with r.client.pipeline(transaction=False) as pipe:
                    for who in owners:
                        pipe.zrevrange(r.key("listed", who), 0, limit - 1, withscores=True)
                    ranked: list[Any] = await pipe.execute()
                names = fair([[(m.decode(), at) for m, at in mine] for mine in ranked], limit)
            async with r.client.pipeline(transaction=False) as pipe:
                for session in names:
                    pipe.hgetall(r.key("listing", session))
                rows: list[Any] = await pipe.execute()
            return names, rows

        names, rows = await r.run("listed", read)
        gone = [session for session, row in zip(names, rows, strict=True) if not row]
        if gone:  # expired with their session: let the sorted sets go of them too
            by_owner: dict[str, list[str]] = {}
            for session in gone:
                by_owner.setdefault(session_owner(session), []).append(session)

            async def tidy() -> None:
                async with r.client.pipeline(transaction=False) as pipe:
                    for who, sessions in by_owner.items():
                        pipe.zrem(r.key("listed", who), *sessions)
                    await pipe.execute()

            await r.run("listed", tidy)
        found = [
            Listed.from_hash(session, row) for session, row in zip(names, rows, strict=True) if row
        ]
        return sorted(found, key=lambda entry: entry.last_at, reverse=True)

    async def listed_one(self, session: str) -> Listed | None:
        r = self.redis
        row = await r.run("listed", lambda: r.client.hgetall(r.key("listing", session)))
        return Listed.from_hash(session, row) if row else None

    def _listing_keys(self, session: str, owner: str) -> list[str]:
        r = self.redis
        return [r.key("listing", session), r.key("listed", owner), r.key("listed-owners")]

    async def _evict_owner(self, owner: str, size: int, limit: int) -> None:
        """Delete the owner's least recently active sessions that are not live, until
        writing `size` bytes leaves it at LOW_WATER of its share."""
        r = self.redis
        held = await r.run("put", lambda: r.client.hget(r.key("owners"), owner))
        need = int(held or 0) + size - int(limit * LOW_WATER)
        live_after = time.time() - self.live_s
        evicted = await self._drop_older(live_after, need, r.key("owner", owner))
        if evicted:
            self._forget(set(evicted))
            if self.on_owner_evicted is not None:
                self.on_owner_evicted(owner, evicted)

    async def get(self, ref: str) -> tuple[BlobInfo, bytes] | None:
        cached = self._cache.get(ref)
        if cached is not None:
            return cached
        r = self.redis
        raw, data = await r.run("get", lambda: r.client.hmget(r.key("blob", ref), "info", "data"))
        if raw is None or data is None:
            return None
        info = _info_of(raw)
        self._remember(info, data)
        return info, data

    async def blobs(self, session: str) -> list[BlobInfo]:
        return [info for info, _ in await self._session_blobs(session, "list", with_data=False)]

    async def search(self, session: str, phrase: str, limit: int = 5) -> list[tuple[BlobInfo, str]]:
        needle = phrase.lower()
        found: list[tuple[BlobInfo, str]] = []
        for info, data in await self._session_blobs(session, "search", with_data=True):
            if info.kind in RECORDING_KINDS:
                continue
            text = data.decode("utf-8", "replace")
            at = text.lower().find(needle)
            if at >= 0:
                found.append((info, snippet(text, at, len(phrase))))
                if len(found) >= limit:
                    break
        return found

    async def get_checkpoint(self, session: str, key: str) -> bytes | None:
        r = self.redis
        data: bytes | None = await r.run(
            "get_checkpoint", lambda: r.client.hget(r.key("ckpt", session), key)
        )
        return data

    async def put_checkpoint(self, session: str, key: str, data: bytes) -> None:
        self.pressure.claim(len(data))  # small: never waits for room
        r = self.redis
        owner = session_owner(session)
        keys = [r.key("ckpt", session), *self._index(), *self._owner_index(owner)]
        args = [key, data, r.ttl_ms, session, time.time(), owner]
        await r.run("put_checkpoint", lambda: r.put_checkpoint(keys=keys, args=args))

    # -- retention ----------------------------------------------------------------------------

    async def touch(self, sessions: Mapping[str, float]) -> None:
        r = self.redis
        if not sessions:
            return

        async def write() -> None:
            async with r.client.pipeline(transaction=False) as pipe:
                for session, at in sessions.items():
                    owner = session_owner(session)
                    keys = [
                        r.key("sessions"), r.key("blobs", session), r.key("ckpt", session),
                        r.key("owner", owner), r.key("sizes"), r.key("owners"),
                        r.key("listing", session),
                    ]  # fmt: skip
                    args = [session, at, r.ttl_ms, r.key("blob", ""), owner]
                    await r.touch(keys=keys, args=args, client=pipe)
                await pipe.execute()

        await r.run("touch", write)

    async def collect(self, *, expire_before: float, live_after: float) -> Collected:
        before = await self._total()
        expired = await self._drop_older(expire_before, None)
        evicted: list[str] = []
        over_cap = False
        used = await self._total()
        limit = self.pressure.limit
        if limit is not None and used >= limit * KICK_AT:
            evicted = await self._drop_older(live_after, used - int(limit * LOW_WATER))
            used = await self._total()
            over_cap = used >= limit * KICK_AT
        self._forget({*expired, *evicted})
        self.pressure.collected(used)
        return Collected(tuple(expired), tuple(evicted), before, used, over_cap)

    async def stats(self, *, live_after: float) -> StoreStats:
        r = self.redis

        async def read() -> StoreStats:
            names = [m.decode() for m in await r.client.zrange(r.key("sessions"), 0, -1)]
            blobs = checkpoints = 0
            for start in range(0, len(names), 512):
                async with r.client.pipeline(transaction=False) as pipe:
                    for session in names[start : start + 512]:
                        pipe.llen(r.key("blobs", session))
                        pipe.hlen(r.key("ckpt", session))
                    counts = await pipe.execute()
                blobs += sum(counts[0::2])
                checkpoints += sum(counts[1::2])
            live = await r.client.zcount(r.key("sessions"), live_after, "+inf")
            oldest = await r.client.zrange(r.key("sessions"), 0, 0, withscores=True)
            total = int(await r.client.get(r.key("bytes")) or 0)
            memory = await r.client.info("memory")
            details = {"redis": r.where, "redis_used_memory": memory.get("used_memory")}
            return StoreStats(
                "redis", len(names), live, blobs, checkpoints, total, total, self.max_bytes,
                oldest[0][1] if oldest else None, details,
            )  # fmt: skip

        return await r.run("stats", read)

    async def _drop_older(
        self, before: float, need: int | None, among: str | None = None
    ) -> list[str]:
        """Delete sessions last active before `before`, least recent first; with `need`,
        only until that many bytes are freed; with `among`, of that sorted set only (an
        owner's sessions)."""
        zset = among or self.redis.key("sessions")
        r = self.redis
        dropped: list[str] = []
        freed = 0
        while need is None or freed < need:
            batch = await r.run(
                "collect",
                lambda: r.client.zrangebyscore(zset, "-inf", f"({before!r}", start=0, num=256),
            )
            if not batch:
                break
            sessions = [member.decode() for member in batch]
            if need is not None:  # only as many as the cap needs gone
                sessions = await self._enough(sessions, need - freed)
            for session, size in zip(sessions, await self._drop(sessions, before), strict=True):
                if size >= 0:
                    dropped.append(session)
                    freed += size
        return dropped

    async def _enough(self, sessions: list[str], need: int) -> list[str]:
        """The first of `sessions` that hold at least `need` bytes together."""
        r = self.redis
        sizes = await r.run("collect", lambda: r.client.hmget(r.key("sizes"), *sessions))
        total = 0
        for count, size in enumerate(sizes, 1):
            total += int(size or 0)
            if total >= need:
                return sessions[:count]
        return sessions

    async def _drop(self, sessions: list[str], before: float) -> list[int]:
        """Delete each session still last active before `before`: the bytes freed, or -1."""
        r = self.redis

        async def drop() -> list[int]:
            async with r.client.pipeline(transaction=False) as pipe:
                for session in sessions:
                    owner = session_owner(session)
                    keys = [
                        *self._index(), r.key("blobs", session), r.key("ckpt", session),
                        *self._owner_index(owner), *self._listing_keys(session, owner),
                    ]  # fmt: skip
                    args = [session, before, r.key("blob", ""), owner]
                    await r.drop(keys=keys, args=args, client=pipe)
                freed: list[int] = await pipe.execute()
                return freed

        return await r.run("collect", drop)

    async def _total(self) -> int:
        r = self.redis
        return int(await r.run("collect", lambda: r.client.get(r.key("bytes"))) or 0)

    def _index(self) -> list[str]:
        r = self.redis
        return [r.key("sessions"), r.key("sizes"), r.key("bytes")]

    def _owner_index(self, owner: str) -> list[str]:
        r = self.redis
        return [r.key("owners"), r.key("owner", owner)]

    def _forget(self, sessions: set[str]) -> None:
        """Drop removed sessions' blobs from the read cache."""
        for ref, (info, _) in list(self._cache.items()):
            if info.session in sessions:
                del self._cache[ref]

    async def probe(self) -> None:
        # A real write: a read-only replica answers READONLY, a full one (maxmemory) OOM.
        r = self.redis
        await r.run("probe", lambda: r.client.set(r.key("probe"), b"1", px=PROBE_TTL_MS))

    async def close(self) -> None:
        self._cache.clear()

    async def _session_blobs(
        self, session: str, what: str, *, with_data: bool
    ) -> list[tuple[BlobInfo, bytes]]:
        r = self.redis

        async def read() -> list[Any]:
            refs = await r.client.lrange(r.key("blobs", session), 0, -1)
            async with r.client.pipeline(transaction=False) as pipe:
                for ref in refs:
                    fields = ("info", "data") if with_data else ("info",)
                    pipe.hmget(r.key("blob", ref.decode()), *fields)
                rows: list[Any] = await pipe.execute()
                return rows

        out: list[tuple[BlobInfo, bytes]] = []
        for row in await r.run(what, read):
            if row[0] is not None:  # expired meanwhile
                out.append((_info_of(row[0]), row[1] if with_data else b""))
        out.sort(key=lambda entry: entry[0].created_at)  # stable: write order among equals
        return out

    def _remember(self, info: BlobInfo, data: bytes) -> None:
        if len(data) + 256 <= self._cache.maxsize:
            self._cache[info.ref] = (info, data)


class RedisState:
    """The StateStore protocol over Redis; counters are added in one Lua call each."""

    backend = "redis"

    def __init__(self, redis: RedisConnection) -> None:
        self.redis = redis

    async def get(self, space: str, key: str) -> bytes | None:
        r = self.redis
        value: bytes | None = await r.run(
            "state_get", lambda: r.client.get(r.key("state", space, key))
        )
        return value

    async def set(self, space: str, key: str, value: bytes, ttl_s: float | None = None) -> None:
        r = self.redis
        ms = r.ttl_for(ttl_s) or None
        await r.run("state_set", lambda: r.client.set(r.key("state", space, key), value, px=ms))

    async def delete(self, space: str, key: str) -> None:
        r = self.redis
        await r.run("state_delete", lambda: r.client.delete(r.key("state", space, key)))

    async def counters(self, space: str, key: str) -> dict[str, float]:
        r = self.redis
        raw = await r.run("counters", lambda: r.client.hgetall(r.key("count", space, key)))
        return {name.decode(): float(value) for name, value in raw.items()}

    async def add(
        self,
        space: str,
        key: str,
        amounts: Mapping[str, float],
        *,
        first: Mapping[str, float] | None = None,
        ttl_s: float | None = None,
    ) -> dict[str, float]:
        r = self.redis
        args: list[Any] = [r.ttl_for(ttl_s), len(amounts)]
        for name, amount in amounts.items():
            args += [name, repr(float(amount))]
        for name, value in (first or {}).items():
            args += [name, repr(float(value))]
        keys = [r.key("count", space, key)]
        flat = await r.run("add", lambda: r.add(keys=keys, args=args))
        return {flat[i].decode(): float(flat[i + 1]) for i in range(0, len(flat), 2)}

    async def publish(self, space: str, field: str, value: float, ttl_s: float) -> None:
        r = self.redis
        fact = f"{time.time() + ttl_s!r} {value!r}"
        await r.run("publish", lambda: r.client.hset(r.key("pub", space), field, fact))

    async def published(self, space: str) -> dict[str, float]:
        r = self.redis
        name = r.key("pub", space)
        raw = await r.run("published", lambda: r.client.hgetall(name))
        now = time.time()
        valid: dict[str, float] = {}
        stale: list[bytes] = []
        for field, fact in raw.items():
            expiry, value = (float(part) for part in fact.split())
            if expiry >= now:
                valid[field.decode()] = value
            else:
                stale.append(field)
        if stale:  # tidy up; a failure here changes nothing
            await r.run("published", lambda: r.client.hdel(name, *stale))
        return valid

    async def close(self) -> None:
        await self.redis.close()


def _figures(entry: Listed) -> list[Any]:
    """A turn's figures as _LIST_FUNCTION reads them."""
    names, counts, floats = entry.as_hash()
    first = entry.first_at or entry.last_at
    return [
        repr(first), repr(entry.last_at), len(names) // 2, *names, len(counts) // 2, *counts,
        len(floats) // 2, *floats,
    ]  # fmt: skip


def _info_bytes(info: BlobInfo) -> bytes:
    return orjson.dumps(
        [info.ref, info.session, info.kind, info.size, info.created_at, info.owner, info.meta]
    )


def _info_of(raw: bytes) -> BlobInfo:
    ref, session, kind, size, created_at, owner, meta = orjson.loads(raw)
    return BlobInfo(ref, session, kind, size, created_at, owner, meta)
