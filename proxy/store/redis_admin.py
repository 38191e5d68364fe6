"""The admin records (proxy/store/admin_records.py) in Redis, every replica's.

Keys under the store's prefix: `admin:keys` (a hash: name -> record), `admin:keys:version`
(bumped by each change, in the same script), `admin:audit` (a sorted set: id -> entry, the
entry's JSON holding its id), `admin:audit:at` (id -> time, for retention), `admin:audit:seq`;
`guard:placeholder_key` (32 random bytes, no expiry: the guard's placeholders derive from it).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from proxy.store.admin_records import AUDIT_MAX_ENTRIES, MAX_STORED_KEYS, Order
from proxy.store.redis import RedisConnection

_ADD = """
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('INCR', KEYS[2])
return 1
"""
_REPLACE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('INCR', KEYS[2])
return 1
"""
_DELETE = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('INCR', KEYS[2])
return 1
"""
# KEYS: audit, audit:at, audit:seq. ARGV: the entry's JSON without its closing brace, its
# time, the retention cutoff, the most entries kept. Returns the id.
_APPEND = """
local id = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[1], id, ARGV[1] .. ',"id":' .. id .. '}')
redis.call('ZADD', KEYS[2], ARGV[2], id)
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[3], 'LIMIT', 0, 1000)
for _, gone in ipairs(old) do
  redis.call('ZREMRANGEBYSCORE', KEYS[1], gone, gone)
  redis.call('ZREM', KEYS[2], gone)
end
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[4])
if over > 0 then
  for _, pair in ipairs(redis.call('ZPOPMIN', KEYS[1], over)) do
    redis.call('ZREM', KEYS[2], pair)
  end
end
return id
"""


class RedisAdminRecords:
    def __init__(self, redis: RedisConnection) -> None:
        self._redis = redis
        self._keys = redis.key("admin", "keys")
        self._version = redis.key("admin", "keys", "version")
        self._audit = redis.key("admin", "audit")
        self._audit_at = redis.key("admin", "audit", "at")
        self._seq = redis.key("admin", "audit", "seq")
        self._placeholder_key = redis.key("guard", "placeholder_key")
        client = redis.client
        self._add: Any = client.register_script(_ADD)
        self._replace: Any = client.register_script(_REPLACE)
        self._delete: Any = client.register_script(_DELETE)
        self._append: Any = client.register_script(_APPEND)

    async def keys_version(self) -> int:
        raw = await self._redis.run("keys_version", lambda: self._redis.client.get(self._version))
        return int(raw or 0)

    async def stored_keys(self) -> tuple[int, list[dict[str, Any]]]:
        async def read() -> list[Any]:
            async with self._redis.client.pipeline(transaction=True) as pipe:
                pipe.get(self._version)
                pipe.hgetall(self._keys)
                return list(await pipe.execute())

        version, records = await self._redis.run("stored_keys", read)
        found = [orjson.loads(records[name]) for name in sorted(records)]
        return int(version or 0), found

    async def add_key(self, record: dict[str, Any]) -> bool:
        args = [record["name"], orjson.dumps(record), MAX_STORED_KEYS]
        keys = [self._keys, self._version]
        return bool(await self._redis.run("add_key", lambda: self._add(keys=keys, args=args)))

    async def replace_key(self, record: dict[str, Any]) -> bool:
        args = [record["name"], orjson.dumps(record)]
        keys = [self._keys, self._version]
        done = await self._redis.run("replace_key", lambda: self._replace(keys=keys, args=args))
        return bool(done)

    async def delete_key(self, name: str) -> bool:
        keys = [self._keys, self._version]
        done = await self._redis.run("delete_key", lambda: self._delete(keys=keys, args=[name]))
        return bool(done)

    async def append_audit(self, entry: dict[str, Any], keep_s: float) -> int:
        body = orjson.dumps(entry)[:-1]  # the script closes it with the id
        if body == b"{":
            raise ValueError("an audit entry holds at least its action")
        args = [body, entry["at"], time.time() - keep_s, AUDIT_MAX_ENTRIES]
        keys = [self._audit, self._audit_at, self._seq]
        added = await self._redis.run("append_audit", lambda: self._append(keys=keys, args=args))
        return int(added)

    async def audit(self, after: int | None, limit: int, order: Order) -> list[dict[str, Any]]:
        client = self._redis.client
        if order == "newest":
            high = f"({after}" if after is not None else "+inf"
            members = await self._redis.run(
                "audit", lambda: client.zrevrangebyscore(self._audit, high, "-inf", 0, limit)
            )
        else:
            low = f"({after}" if after is not None else "-inf"
            members = await self._redis.run(
                "audit", lambda: client.zrangebyscore(self._audit, low, "+inf", 0, limit)
            )
        entries = [orjson.loads(member) for member in members]
        return [{"id": e.pop("id"), **e} for e in entries]

    async def placeholder_key(self, drawn: bytes) -> bytes:
        async def kept() -> bytes:
            async with self._redis.client.pipeline(transaction=True) as pipe:
                pipe.set(self._placeholder_key, drawn, nx=True)  # the first replica's stays
                pipe.get(self._placeholder_key)
                return bytes((await pipe.execute())[1] or b"")

        return await self._redis.run("placeholder_key", kept)

    async def close(self) -> None:
        pass  # the connection is the store's, closed with it
