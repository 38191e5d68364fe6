"""A request's head (request line and headers) must arrive whole within `server.head_timeout_s`.

aiohttp has no such limit: a connection that sends nothing, half a head, or one header byte
every few seconds (slowloris) is held until its keep-alive timeout, an hour, each one a file
descriptor and a parser. Here the deadline runs from the moment a connection opens, and on a
kept-alive one from the first byte of its next head (the idle time before it is the keep-alive
timeout's to govern). Past it the connection is closed: after a 408 in the wire format of the
route the head began to name when it sent anything, counted as an `unmatched` 408.

The hooks are aiohttp's connection protocol (`RequestHandler`, here its subclass that keeps
pipelined and half-closed requests' answers: proxy/runtime/connection_ends.py), made by a
`web.Server` of ours: `ProxyRunner` serves the app with them and with SERVER_OPTIONS, for
`serve` and tests alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from proxy.app import SERVER_OPTIONS
from proxy.errors import RequestTimeout
from proxy.runtime.connection_ends import OrderlyEndsHandler
from proxy.state import CONFIG, METRICS
from proxy.wire.base import ErrorFrames
from proxy.wire.registry import WIRES

_FRAMES = ErrorFrames(WIRES)  # no route matched yet: the path's wire frames the 408
HEAD_START_BYTES = 64  # enough of a head to see which route it names


class HeadTimedHandler(OrderlyEndsHandler):
    """One connection: the head of each request must be whole within the deadline."""

    __slots__ = ("_head_began", "_head_timeout", "_head_timer", "_on_late")

    def __init__(
        self,
        manager: web.Server,
        *,
        head_timeout: Callable[[], float],
        on_late: Callable[[], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._head_timeout = head_timeout
        self._on_late = on_late
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_began = b""  # the first bytes of the head under way

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm(b"")

    def data_received(self, data: bytes) -> None:
        # Idle (no request being handled, none queued): these bytes begin the next head.
        idle = self._waiter is not None and not self._waiter.done()
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads:  # a whole head arrived (or a malformed one, refused)
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
        elif self._head_timer is None:
            if idle:
                self._arm(data)
        elif len(self._head_began) < HEAD_START_BYTES:
            self._head_began += data[: HEAD_START_BYTES - len(self._head_began)]

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _arm(self, began: bytes) -> None:
        self._head_began = began[:HEAD_START_BYTES]
        self._head_timer = self._loop.call_later(self._head_timeout(), self._late)

    def _late(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._head_began:  # a request began: say why it ends, then hang up
            self._on_late()
            transport.write(_answer(self._head_began, self._head_timeout()))
        self.force_close()


def _answer(head: bytes, timeout_s: float) -> bytes:
    """A 408 in the wire format of the route the head began to name (OpenAI's by default)."""
    error = RequestTimeout(
        f"the request head (request line and headers) was not complete within {timeout_s:g} s "
        "(server.head_timeout_s)"
    )
    path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
    body = orjson.dumps(_FRAMES(None, path.decode("latin-1"), error, None))
    return (
        b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )


class HeadTimedServer(web.Server):
    """aiohttp's Server, making HeadTimedHandlers; built from the one the app made."""

    def __init__(self, made: web.Server, app: web.Application) -> None:
        super().__init__(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=made._loop,
            **made._kwargs,
        )
        holder, metrics = app[CONFIG], app[METRICS]
        late = metrics.child(metrics.requests, "unmatched", "-", str(RequestTimeout.status))
        self._head_timeout = lambda: holder.current.server.head_timeout_s
        self._on_late = late.inc

    def __call__(self) -> RequestHandler:
        return HeadTimedHandler(
            self,
            loop=self._loop,
            head_timeout=self._head_timeout,
            on_late=self._on_late,
            **self._kwargs,
        )


class ProxyRunner(web.AppRunner):
    """How the proxy's app is served: SERVER_OPTIONS, and the head deadline."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        super().__init__(app, **{**kwargs, **SERVER_OPTIONS})

    async def _make_server(self) -> web.Server:
        return HeadTimedServer(await super()._make_server(), self.app)
