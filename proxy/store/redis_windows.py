"""Rate-limit windows in Redis, shared by every replica on the same prefix: the arithmetic of
proxy/store/windows.py, one Lua script per admission and one per release (one round trip
each), on Redis' own clock (TIME), so replicas whose clocks differ still agree.

    <p>rate:<subject>     hash {at, r, t}           last refill time, requests and tokens left
    <p>lease:<subject>    sorted set {lease: expiry} requests in flight (max_concurrent)

A bucket's hash expires once it would be full again (absent = full). A lease expires after
`lease_s` (server.response_timeout_s): a replica that died holding slots frees them then, and
a request that runs longer stops holding its slot then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.store.redis import RedisConnection
from proxy.store.windows import CONCURRENCY_RETRY_S, Refusal, Subject

LIMITS = ("rpm", "tpm", "max_concurrent")

# KEYS: per subject, its hash and its leases. ARGV: lease, tokens, lease ms, retry s for a
# full max_concurrent, then per subject rpm, tpm, max_concurrent (0: none).
# Returns {0} when admitted, else {subject index (1-based), limit index, wait in seconds}.
_TAKE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
local tokens = tonumber(ARGV[2])
local n = #KEYS / 2
local levels = {}
local worst, who, what = -1, 0, 0
for i = 1, n do
  local rpm = tonumber(ARGV[2 + 3 * i])
  local tpm = tonumber(ARGV[3 + 3 * i])
  local most = tonumber(ARGV[4 + 3 * i])
  local h = redis.call('HMGET', KEYS[2 * i - 1], 'at', 'r', 't')
  local elapsed = math.max(0, now - (tonumber(h[1]) or now))
  local r = math.min(rpm, (tonumber(h[2]) or rpm) + elapsed * rpm / 60)
  local t = math.min(tpm, (tonumber(h[3]) or tpm) + elapsed * tpm / 60)
  levels[i] = {r, t}
  if rpm > 0 and r < 1 then
    local wait = (1 - r) * 60 / rpm
    if wait > worst then worst, who, what = wait, i, 1 end
  end
  if tpm > 0 then
    local need = math.min(tokens, tpm)
    if t < need then
      local wait = (need - t) * 60 / tpm
      if wait > worst then worst, who, what = wait, i, 2 end
    end
  end
  if most > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2 * i], '-inf', now)
    if redis.call('ZCARD', KEYS[2 * i]) >= most then
      local wait = tonumber(ARGV[4])
      if wait > worst then worst, who, what = wait, i, 3 end
    end
  end
end
if who > 0 then return {who, what, tostring(worst)} end
for i = 1, n do
  local rpm = tonumber(ARGV[2 + 3 * i])
  local tpm = tonumber(ARGV[3 + 3 * i])
  local most = tonumber(ARGV[4 + 3 * i])
  if rpm > 0 or tpm > 0 then
    local r, t = levels[i][1] - (rpm > 0 and 1 or 0), levels[i][2] - (tpm > 0 and tokens or 0)
    redis.call('HSET', KEYS[2 * i - 1], 'at', tostring(now), 'r', tostring(r), 't', tostring(t))
    local full = 0
    if rpm > 0 then full = math.max(full, (rpm - r) * 60 / rpm) end
    if tpm > 0 then full = math.max(full, (tpm - t) * 60 / tpm) end
    redis.call('PEXPIRE', KEYS[2 * i - 1], math.ceil(full * 1000) + 1000)
  end
  if most > 0 then
    redis.call('ZADD', KEYS[2 * i], now + tonumber(ARGV[3]) / 1000, ARGV[1])
    redis.call('PEXPIRE', KEYS[2 * i], ARGV[3])
  end
end
return {0}
"""
# KEYS as _TAKE's. ARGV: lease, tokens returned (negative: taken), then per subject rpm, tpm.
_GIVE_BACK = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
local back = tonumber(ARGV[2])
for i = 1, #KEYS / 2 do
  redis.call('ZREM', KEYS[2 * i], ARGV[1])
  local rpm = tonumber(ARGV[1 + 2 * i])
  local tpm = tonumber(ARGV[2 + 2 * i])
  if tpm > 0 and back ~= 0 then
    local h = redis.call('HMGET', KEYS[2 * i - 1], 'at', 'r', 't')
    local elapsed = math.max(0, now - (tonumber(h[1]) or now))
    local r = math.min(rpm, (tonumber(h[2]) or rpm) + elapsed * rpm / 60)
    local t = math.min(tpm, (tonumber(h[3]) or tpm) + elapsed * tpm / 60 + back)
    redis.call('HSET', KEYS[2 * i - 1], 'at', tostring(now), 'r', tostring(r), 't', tostring(t))
    local full = (tpm - t) * 60 / tpm
    if rpm > 0 then full = math.max(full, (rpm - r) * 60 / rpm) end
    redis.call('PEXPIRE', KEYS[2 * i - 1], math.ceil(full * 1000) + 1000)
  end
end
return 1
"""


class RedisWindows:
    backend = "redis"

    def __init__(self, redis: RedisConnection, lease_s: float) -> None:
        self.redis = redis
        self.lease_ms = max(1000, int(lease_s * 1000))
        self._take: Any = redis.client.register_script(_TAKE)
        self._give_back: Any = redis.client.register_script(_GIVE_BACK)

    def _keys(self, subjects: Sequence[Subject]) -> list[str]:
        key = self.redis.key
        return [k for s in subjects for k in (key("rate", s.id), key("lease", s.id))]

    async def take(self, subjects: Sequence[Subject], lease: str, tokens: int) -> Refusal | None:
        r = self.redis
        args: list[Any] = [lease, tokens, self.lease_ms, CONCURRENCY_RETRY_S]
        for _, limits in subjects:
            args += [limits.rpm or 0, limits.tpm or 0, limits.max_concurrent or 0]
        keys = self._keys(subjects)
        found = await r.run("rate_take", lambda: self._take(keys=keys, args=args))
        if int(found[0]) == 0:
            return None
        return Refusal(int(found[0]) - 1, LIMITS[int(found[1]) - 1], float(found[2]))

    async def give_back(self, subjects: Sequence[Subject], lease: str, tokens: float) -> None:
        r = self.redis
        args: list[Any] = [lease, repr(float(tokens))]
        for _, limits in subjects:
            args += [limits.rpm or 0, limits.tpm or 0]
        keys = self._keys(subjects)
        await r.run("rate_give_back", lambda: self._give_back(keys=keys, args=args))
