"""How a connection ends never costs a request sent before it its answer.

Two things aiohttp's connection protocol (`RequestHandler`, aiohttp 3.14) does otherwise:

- Pipelined garbage: its parser reads every request in the bytes that arrived, and when it
  meets garbage after a whole request it raises, and the requests it had read before are lost:
  the client gets one 400, meant for the garbage, in place of their answers. Here the parser
  stops after each request (aiohttp's own pause, at a message queue of one) and keeps what
  follows for the next read, which this protocol runs at once: the requests are queued in order,
  then the 400 for the garbage, answered in that order before the connection closes.
- Half-close: a client that sends its whole request and then shuts down its sending side
  (`shutdown(SHUT_WR)`, `printf ... | nc -N`) made asyncio close the connection, and the
  handler was cancelled. Here the connection stays open to answer what was asked, and closes
  after the last answer; with nothing asked it closes at once.

TCP cannot tell a half-close from a client that closed its socket and left: both send a FIN.
One that left must still cancel its upstream call at once (a stream it stopped reading, an
answer it gave up waiting for: tests/routes/test_client_gone.py), and it leaves after waiting a
while, or once the answer began; a half-closing client shuts its side down as it finishes
sending. So a FIN within HALF_CLOSE_WINDOW_S of the request's last bytes, the request whole and
its answer not begun, is the end of the request; any other, while an answer is awaited, is a
client gone, as aiohttp has it (a body cut short can never be whole either).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_parser import HttpRequestParser
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.web_protocol import RequestHandler, RequestPayloadError, _ErrInfo
from aiohttp.web_request import BaseRequest

HALF_CLOSE_WINDOW_S = 0.1  # a FIN this soon after the request's last bytes is part of it


class OrderlyEndsHandler(RequestHandler):
    """One connection: each request read, then answered, before its end is acted on."""

    __slots__ = ("_answered", "_client_done", "_data_at", "_last_body")

    def __init__(self, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._client_done = False  # the client half-closed: answer what it asked, then close
        self._answered = 0  # of the _request_count requests read (a malformed head counts)
        self._data_at = 0.0  # when the last bytes arrived (loop time)
        self._last_body: StreamReader = EMPTY_PAYLOAD  # of the last request read
        # aiohttp's parser, as RequestHandler makes it, made to stop after each request.
        self._parser = HttpRequestParser(
            self,
            self._loop,
            self._read_bufsize,
            max_line_size=self.max_line_size,
            max_field_size=self.max_field_size,
            max_headers=self.max_headers,
            payload_exception=RequestPayloadError,
            auto_decompress=kwargs.get("auto_decompress", True),
            max_msg_queue_size=1,
        )

    def data_received(self, data: bytes) -> None:
        if data:
            self._data_at = self._loop.time()
        heads = self._request_count
        super().data_received(data)
        # The parser stopped after a request; the bytes after it are read now, one request (or
        # one malformed head, queued as its 400) at a time, while the queue has room.
        while (
            self._request_count != heads
            and self._parser is not None
            and not self._buffer_paused
            and not isinstance(self._messages[-1][0], _ErrInfo)  # the parser is spent
        ):
            heads = self._request_count
            self._parser.message_consumed()  # room for one more (the queue is bounded here)
            super().data_received(b"")
        if self._messages:
            self._last_body = self._messages[-1][1]

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio.Protocol's
        if self._answered == self._request_count:
            return None  # nothing asked, or all answered: asyncio closes the connection
        answering = self._current_request
        if (
            self._loop.time() - self._data_at > HALF_CLOSE_WINDOW_S
            or not self._last_body.is_eof()
            or (answering is not None and answering.writer.output_size > 0)
        ):
            return None  # a client that left while its answer was awaited: cancel it
        self._client_done = True
        if self._request_in_progress and self._answered + 1 == self._request_count:
            self.close()  # after the answer under way, the last one asked
        return True  # keep the connection open to answer

    async def _handle_request(
        self,
        request: BaseRequest,
        start_time: float | None,
        request_handler: Callable[[BaseRequest], Awaitable[web.StreamResponse]],
    ) -> tuple[web.StreamResponse, bool]:
        if self._client_done and self._answered + 1 == self._request_count:
            self.close()  # the last request the client sent: close after its answer
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            self._answered += 1
