"""Lua scripts sent to Redis on a connection of their own, pipelined: every call made while a
batch is on its way waits for it and goes in the next, in one write and one read.

The rate limits run a script on every request's admission and another at its end; through
redis-py's client each costs about what a GET does (a connection from the pool and back, a
task bounding the write, the command packed by general code): ~60 µs of CPU, a third of a
common turn's. Here a call costs its packing, a future and its reply's parsing, and the round
trip's own cost (the write, the wake-up, the read) is shared by every call of its batch: under
load, requests arriving together share one.

The connection is made as the client's pool makes its own (address, TLS, password, database),
without socket timeouts: a batch as a whole is bounded by `timeout_s` instead. A batch that
fails or times out fails every call in it (a RedisError or a TimeoutError) and the connection
is dropped; the next batch connects again. A script Redis does not know (restarted, flushed) is
sent whole once (EVAL: Redis keeps it), its call answered from that. A script is sent whole
the first time on each connection too, so that calls run in the order they were made even
after a Redis restart (a call re-sent after NOSCRIPT would run after the ones behind it; only a
SCRIPT FLUSH on a live connection can still do that, to the calls of that one batch). Calls
queued past
MAX_WAITING fail at once: Redis is not keeping up and waiting longer would not help.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from hashlib import sha1
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

MAX_WAITING = 10_000  # calls queued behind the batch on its way, at most


class PipedScript:
    """One Lua script, called as EVALSHA and, when Redis does not know it, as EVAL."""

    def __init__(self, text: str) -> None:
        self.text = text.encode()
        self.sha = sha1(self.text).hexdigest().encode()

    def command(self, keys: Sequence[str], args: Sequence[Any], *, whole: bool = False) -> bytes:
        """The call in RESP: EVALSHA sha numkeys keys... args... (EVAL script ... when whole)."""
        head = (b"EVAL", self.text) if whole else (b"EVALSHA", self.sha)
        parts = [*head, str(len(keys)).encode(), *map(_encode, keys), *map(_encode, args)]
        out = [b"*%d\r\n" % len(parts)]
        for part in parts:
            out.append(b"$%d\r\n" % len(part))
            out.append(part)
            out.append(b"\r\n")
        return b"".join(out)


def _encode(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        raise TypeError("a script argument cannot be a bool")
    if isinstance(value, int | float):
        return repr(value).encode()
    raise TypeError(f"a script argument cannot be {type(value).__name__}")


class _Call:
    __slots__ = ("args", "future", "keys", "script", "whole")

    def __init__(
        self, script: PipedScript, keys: Sequence[str], args: Sequence[Any], future: Any
    ) -> None:
        self.script = script
        self.keys = keys
        self.args = args
        self.future: asyncio.Future[Any] = future
        self.whole = False


class ScriptPipe:
    def __init__(self, client: Any, timeout_s: float) -> None:
        pool = client.connection_pool
        # The pool's own connection settings (address, TLS, auth, db, parser), without its
        # socket timeouts: the batch is bounded as a whole (asyncio.timeout, no task per write).
        kwargs = {**pool.connection_kwargs, "socket_timeout": None}
        self._connection: Any = pool.connection_class(**kwargs)
        self.timeout_s = timeout_s
        self._waiting: list[_Call] = []
        self._pumping: asyncio.Task[None] | None = None
        self._closed = False
        self._known: set[bytes] = set()  # scripts this connection has sent whole
        self.batches = 0  # round trips made (the tests read it)

    def call(
        self, script: PipedScript, keys: Sequence[str], args: Sequence[Any]
    ) -> asyncio.Future[Any]:
        """The script's reply, to come: the call is sent whether or not it is still awaited
        then (a caller that leaves cannot take back what the script did)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._closed:
            future.set_exception(RedisConnectionError("the script pipe is closed"))
        elif len(self._waiting) >= MAX_WAITING:
            future.set_exception(RedisConnectionError("too many scripts waiting for redis"))
        else:
            self._waiting.append(_Call(script, keys, args, future))
            if self._pumping is None:
                self._pumping = loop.create_task(self._pump())
        return future

    async def _pump(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                self.batches += 1
                await self._send(batch)
        finally:
            self._pumping = None

    async def _send(self, batch: list[_Call]) -> None:
        connection = self._connection
        try:
            async with asyncio.timeout(self.timeout_s):
                packed = b"".join(self._command(call) for call in batch)
                await connection.send_packed_command(packed, check_health=False)
                again: list[_Call] = []
                for call in batch:
                    try:
                        reply = await connection.read_response()
                    except NoScriptError as exc:
                        self._known.clear()  # flushed: every script is sent whole again
                        if call.whole:
                            _fail(call, exc)
                        else:
                            call.whole = True  # sent whole first in the next batch
                            again.append(call)
                    except ResponseError as exc:  # the script's own error: this call's alone
                        _fail(call, exc)
                    else:
                        if not call.future.done():
                            call.future.set_result(reply)
                self._waiting[:0] = again
        except Exception as exc:  # every call of the batch learns of it
            self._known.clear()  # the next connection may be to a Redis that restarted
            await connection.disconnect(nowait=True)
            for call in batch:
                _fail(call, exc)
        except asyncio.CancelledError:
            self._known.clear()
            await connection.disconnect(nowait=True)
            for call in batch:
                _fail(call, RedisConnectionError("the script pipe was closed"))
            raise

    def _command(self, call: _Call) -> bytes:
        sha = call.script.sha
        if sha not in self._known:
            call.whole = True
            self._known.add(sha)  # the calls behind it in the batch find it loaded
        return call.script.command(call.keys, call.args, whole=call.whole)

    async def close(self) -> None:
        self._closed = True
        pumping = self._pumping
        if pumping is not None:
            pumping.cancel()
            await asyncio.gather(pumping, return_exceptions=True)
        for call in self._waiting:
            _fail(call, RedisConnectionError("the script pipe was closed"))
        self._waiting = []
        await self._connection.disconnect()


def _fail(call: _Call, exc: BaseException) -> None:
    future = call.future
    if not future.done():
        future.set_exception(exc)
        # Marked retrieved: a caller gone by then would have the loop report it as never seen.
        future.exception()
