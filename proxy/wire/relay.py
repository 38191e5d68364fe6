"""What every wire's stream relay shares: writing to the client (its time kept apart from the
proxy's own), charging a stream cut before its usage came, and ending a stream that already
began with an error event in the wire's framing. A wire says how it relays one upstream stream
(`_relay`), what it holds back for a recall round, and how its error events look."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from aiohttp import web

from proxy.errors import ProxyError, UpstreamTimeout
from proxy.exchange import Exchange
from proxy.guards.secrets.restore import StreamRestorer
from proxy.guards.tool_rules import Verdict
from proxy.upstream.base import UpstreamHTTPError, UpstreamStream
from proxy.upstream.priming import data_of, is_json_object


class StreamRelay:
    # How an error event starts on this wire: OpenAI chat's is a bare data line.
    error_prefix = b"event: error\ndata: "
    # Bytes every event carrying a piece of the answer (text, tool arguments, reasoning) has on
    # this wire, whatever its JSON spacing: only an event with one is parsed, and only until
    # the first piece came (`carries_token` says whether it is one: the time to first token).
    token_marks: tuple[bytes, ...] = ()

    def __init__(self, request: web.Request, ex: Exchange, response: web.StreamResponse) -> None:
        self.request = request
        self.ex = ex
        self.response = response
        self.hold_tool_calls = False  # set when the recall tool was offered
        # Whether a call of this tool is held until complete: a guard rule could match it
        # (proxy/guards/tool_rules.py); None: no rules, nothing watched.
        self.watch_tool: Callable[[str], bool] | None = None
        self.usage_reported = False  # the stream being relayed carried its usage
        self.relayed = 0  # events of that stream relayed (or held) so far
        self._kept = 0  # bytes written, while they are kept for the recording
        # The session's secrets given back where the answer carries their placeholders.
        self._restorer = None if ex.secrets is None else StreamRestorer(ex.secrets)
        # server.stream_timeout_s: when the whole stream (every round) must have ended.
        limit = ex.config.server.stream_timeout_s
        self.deadline = None if limit is None else asyncio.get_running_loop().time() + limit

    @property
    def started(self) -> bool:
        """Bytes went out: a failure can only end the stream now, not replace it."""
        return self.response.prepared

    async def write(self, data: bytes) -> None:
        if not self.response.prepared:
            self.response.headers["server-timing"] = self.ex.server_timing()
            await self.response.prepare(self.request)
        if self.ex.streamed is not None:  # a recorded session: the answer as the client got it
            self._keep(self.ex.streamed, data)  # (its secrets not given back)
        if self._restorer is not None:
            data = self._restorer.feed(data)
        waited = time.perf_counter()
        await self.response.write(data)
        self.ex.timing.client_wait += time.perf_counter() - waited

    def _keep(self, kept: list[bytes], data: bytes) -> None:
        """Keep what was written for the recording, up to the session's recording bound: a
        stream longer than that (nothing else bounds a stream's total) is not kept in memory,
        and its turn is recorded without its answer."""
        self._kept += len(data)
        if self._kept <= self.ex.policy.record.max_mb_per_session * 1024 * 1024:
            kept.append(data)
        else:
            self.ex.streamed = None

    async def run(self, source: UpstreamStream) -> Any:
        """Forward one upstream stream; what was held back for a recall round, if anything."""
        self.usage_reported, self.relayed = False, 0
        try:
            if self.deadline is None:  # the common case: no timer to set
                return await self._relay(source)
            return await self._relay_until(self.deadline, source)
        except BaseException:
            # Cut short (the client left, the upstream broke) before the usage came: still
            # charged, estimated from what was relayed.
            if not self.usage_reported:
                self.ex.add_unreported_usage(completion_tokens=self.relayed)
            raise

    async def _relay_until(self, deadline: float, source: UpstreamStream) -> Any:
        """`_relay`, cut at the deadline: one timer for the round, not one per event."""
        try:
            async with asyncio.timeout_at(deadline) as scope:
                return await self._relay(source)
        except TimeoutError:
            if not scope.expired():
                raise
            limit = self.ex.config.server.stream_timeout_s
            raise UpstreamTimeout(
                f"the stream from '{self.ex.alias}' ran longer than server.stream_timeout_s "
                f"({limit:g}s) and was ended; raise it if answers this long are expected"
            ) from None

    async def fail(self, error: ProxyError | UpstreamHTTPError) -> None:
        """Bytes already reached the client: end the stream with an error event it reads."""
        with contextlib.suppress(ConnectionResetError):
            await self.response.write(
                self._held() + self.error_prefix + self.error_data(error) + b"\n\n"
            )

    def error_data(self, error: ProxyError | UpstreamHTTPError) -> bytes:
        if isinstance(error, UpstreamHTTPError):
            return error.body
        return orjson.dumps(error.body(self.ex.identity.request_id))

    async def end(self) -> None:
        held = self._held()
        if held:
            await self.response.write(held)
        await self.response.write_eof()

    def _held(self) -> bytes:
        """What the restorer held back (a last event ending on a placeholder's beginning)."""
        return b"" if self._restorer is None else self._restorer.end()

    async def batches(self, source: UpstreamStream) -> AsyncIterator[list[bytes]]:
        """The upstream's events in the batches they arrived in; the time spent waiting for
        them is the upstream's, not the proxy's."""
        events = source.events()
        while True:
            waited = time.perf_counter()
            try:
                batch = await anext(events)
            except StopAsyncIteration:
                return
            finally:
                self.ex.timing.upstream_wait += time.perf_counter() - waited
            if self.ex.timing.first_token is None and self._has_token(batch):
                self.ex.timing.first_token = time.perf_counter()
            self.relayed += len(batch)
            yield batch

    def _has_token(self, batch: list[bytes]) -> bool:
        for event in batch:
            if any(mark in event for mark in self.token_marks):
                data = _parsed(event)
                if data is not None and self.carries_token(data):
                    return True
        return False

    def carries_token(self, data: dict[str, Any]) -> bool:
        """The event (parsed) carries a piece of the answer."""
        return False

    async def release(self, held: Any, verdict: Verdict | None) -> None:
        """What `run` held back, without the proxy's own calls and those the guard denied
        (`verdict`: their positions among the client's calls, and the text saying why), and
        the stream's end."""
        raise NotImplementedError

    async def _relay(self, source: UpstreamStream) -> Any:
        raise NotImplementedError


def _parsed(event: bytes) -> dict[str, Any] | None:
    """An event's data as a JSON object; None when it is not one (the relay says so itself)."""
    payload = data_of(event)
    if payload is None or not is_json_object(payload):
        return None
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def nonempty(value: object) -> bool:
    """A piece of text (or of tool arguments): a string with something in it."""
    return isinstance(value, str) and value != ""
