"""The rate limits' script pipe on a real Redis: calls made together share one round trip and
each gets its own reply, in order; a script Redis forgot is sent whole; a script's error is its
call's alone; a Redis that stops fails the calls and one that comes back is used again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from proxy.store.redis_pipe import PipedScript, ScriptPipe
from tests.conftest import REDIS_URL, OwnRedis, start_redis

ADD = PipedScript("return redis.call('INCRBY', KEYS[1], ARGV[1])")
WRITE = PipedScript("redis.call('SET', KEYS[1], ARGV[1]) return 1")
READ = PipedScript("return redis.call('GET', KEYS[1])")
FAILS = PipedScript("return redis.error_reply('ERR refused by the script')")


@pytest.fixture
async def client(redis_prefix: str) -> AsyncIterator[Any]:
    client = aioredis.Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


async def test_calls_made_together_share_a_round_trip(client: Any, redis_prefix: str) -> None:
    pipe = ScriptPipe(client, timeout_s=2)
    key = redis_prefix + "n"
    replies = await asyncio.gather(*(pipe.call(ADD, [key], [1]) for _ in range(40)))
    assert sorted(replies) == list(range(1, 41))
    assert replies == list(range(1, 41))  # in the order they were made
    assert pipe.batches <= 2  # the first alone, the rest behind it: not 40
    await pipe.close()


async def test_a_script_redis_forgot_is_sent_whole(client: Any, redis_prefix: str) -> None:
    pipe = ScriptPipe(client, timeout_s=2)
    key = redis_prefix + "n"
    assert await pipe.call(ADD, [key], [5]) == 5
    await client.script_flush()  # as a restarted Redis without persistence would have it
    assert await asyncio.gather(pipe.call(ADD, [key], [1]), pipe.call(ADD, [key], [1])) == [6, 7]
    assert await pipe.call(ADD, [key], [1]) == 8
    await pipe.close()


async def test_calls_keep_their_order_when_redis_knows_one_script_only(
    client: Any, redis_prefix: str
) -> None:
    """A script sent first on a connection goes whole: re-sent after a NOSCRIPT, the write would
    run after the read made behind it."""
    key = redis_prefix + "v"
    await client.set(key, "old")
    await client.script_flush()
    await client.eval(READ.text.decode(), 1, key)  # Redis knows the read, not the write
    pipe = ScriptPipe(client, timeout_s=2)
    found = await asyncio.gather(pipe.call(WRITE, [key], ["new"]), pipe.call(READ, [key], []))
    assert found == [1, b"new"]
    await pipe.close()


async def test_a_scripts_error_is_its_calls_alone(client: Any, redis_prefix: str) -> None:
    pipe = ScriptPipe(client, timeout_s=2)
    key = redis_prefix + "n"
    found = await asyncio.gather(
        pipe.call(ADD, [key], [1]),
        pipe.call(FAILS, [], []),
        pipe.call(ADD, [key], [1]),
        return_exceptions=True,
    )
    assert found[0] == 1 and found[2] == 2
    assert isinstance(found[1], ResponseError) and "refused by the script" in str(found[1])
    await pipe.close()


async def test_a_stopped_redis_fails_the_calls_and_one_back_is_used(own_redis: OwnRedis) -> None:
    port, processes = own_redis
    start_redis(port, processes)
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    await _until_up(client)
    pipe = ScriptPipe(client, timeout_s=1)
    assert await pipe.call(ADD, ["n"], [1]) == 1
    processes[-1].terminate()
    processes[-1].wait(5)
    started = time.monotonic()
    with pytest.raises((RedisError, OSError, TimeoutError)):
        await pipe.call(ADD, ["n"], [1])
    assert time.monotonic() - started < 2
    start_redis(port, processes)  # without persistence: empty, its scripts forgotten
    await _until_up(client)
    assert await pipe.call(ADD, ["n"], [1]) == 1
    await pipe.close()
    await client.aclose()


async def test_a_closed_pipe_refuses_calls(client: Any, redis_prefix: str) -> None:
    pipe = ScriptPipe(client, timeout_s=2)
    await pipe.close()
    with pytest.raises(RedisError):
        await pipe.call(ADD, [redis_prefix + "n"], [1])


async def _until_up(client: Any) -> None:
    for _ in range(100):
        try:
            await client.ping()
            return
        except RedisError:
            await asyncio.sleep(0.05)
    raise AssertionError("redis-server did not start")
