"""What every upstream provides: one JSON completion, or a stream of SSE events.

Failures come back as exceptions: `UpstreamHTTPError` when the provider answered with an error
status (its body passes through to the client), or a `ProxyError` subclass from `proxy.errors`
when there was no usable answer (unreachable 502, garbled 502, timeout 504).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.policies.spec import Deployment

# Upstream response headers worth passing on to clients (rate-limit hints, provider timings).
FORWARDED_HEADER_PREFIXES = ("x-ratelimit-", "retry-after", "openai-processing-ms")


def forwarded_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {
        name: value
        for name, value in headers.items()
        if name.lower().startswith(FORWARDED_HEADER_PREFIXES)
    }


@dataclass(slots=True)
class UpstreamReply:
    data: dict[str, Any]  # parsed, for usage accounting
    body: bytes  # the bytes to send on, unchanged
    headers: dict[str, str] = field(default_factory=dict)


class UpstreamStream(Protocol):
    headers: dict[str, str]

    def events(self) -> AsyncIterator[list[bytes]]:
        """Complete SSE events (`data: ...`, without the blank-line separator), in batches of
        what arrived together, so the relay can forward each batch with one write."""
        ...

    async def close(self) -> None: ...


class UpstreamHTTPError(Exception):
    """The provider answered with an error status; `body` is what it said."""

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.body = body
        self.headers = dict(headers)
        # Fields the proxy adds to the body's error object (what recovery tried); none when
        # the provider's answer passes through unchanged.
        self.extra: dict[str, object] = {}


class Upstream(Protocol):
    async def complete(
        self,
        deployment: Deployment,
        body: dict[str, Any],
        request_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> UpstreamReply: ...

    async def open_stream(
        self,
        deployment: Deployment,
        body: dict[str, Any],
        request_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> UpstreamStream: ...

    async def close(self) -> None: ...
