"""Read the start of a stream before the stream is handed to the relay.

While no byte has reached the client a failed stream can still be retried like any other call,
so the start of a stream is part of the call: an upstream that answers 200 and then sends a
garbled event, ends early, or drops the connection fails inside the retry loop (and counts for
circuits and fallbacks) instead of becoming the client's 502. The start is the first two
events: the role chunk alone carries nothing for the client, and the first token follows it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from proxy.errors import UpstreamBadResponse
from proxy.upstream.base import UpstreamStream


def is_json_object(payload: bytes) -> bool:
    """The cheap shape check every relayed event gets (a full parse only when needed)."""
    return payload.startswith(b"{") and payload.endswith(b"}")


def data_of(event: bytes) -> bytes | None:
    """An event's data: its `data:` line, first (OpenAI) or after an `event:` line (Anthropic)."""
    if event.startswith(b"data:"):
        return event[5:].strip()
    at = event.find(b"\ndata:")
    return event[at + 6 :].strip() if at >= 0 else None


PRIMED_EVENTS = 2


class PrimedStream:
    """An opened stream whose start was read and checked; it yields the start first."""

    def __init__(
        self, inner: UpstreamStream, batches: AsyncIterator[list[bytes]], first: list[bytes]
    ) -> None:
        self.inner = inner
        self.headers = inner.headers
        self._batches = batches
        self._first: list[bytes] | None = first

    async def events(self) -> AsyncIterator[list[bytes]]:
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        async for batch in self._batches:
            yield batch

    async def close(self) -> None:
        await self.inner.close()


async def prime(stream: UpstreamStream, alias: str) -> PrimedStream:
    batches = stream.events()
    start: list[bytes] = []
    seen = 0
    try:
        while seen < PRIMED_EVENTS:
            batch = await anext(batches)
            start += batch
            for event in batch:
                payload = data_of(event)
                if payload is None:
                    continue
                if payload == b"[DONE]":
                    return PrimedStream(stream, batches, start)
                if not is_json_object(payload):
                    raise UpstreamBadResponse(
                        f"the upstream for '{alias}' sent a stream event that is not a JSON "
                        f"object: {payload[:60]!r}"
                    )
                seen += 1
    except StopAsyncIteration:
        if seen:  # a short stream (Gemini's can be one chunk): its wire's relay judges its end
            return PrimedStream(stream, _ended(), start)
        await stream.close()
        raise UpstreamBadResponse(
            f"the upstream for '{alias}' ended the stream before 'data: [DONE]'"
        ) from None
    except BaseException:
        await stream.close()
        raise
    return PrimedStream(stream, batches, start)


async def _ended() -> AsyncIterator[list[bytes]]:
    return
    yield  # an async generator that yields nothing
