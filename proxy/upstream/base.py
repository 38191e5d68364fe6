"""What every upstream provides: one JSON completion, or a stream of SSE events.

Failures come back as exceptions: `UpstreamHTTPError` when the provider answered with an error
status (its body passes through to the client), or a `ProxyError` subclass from `proxy.errors`
when there was no usable answer (unreachable 502, garbled 502, timeout 504).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.errors import Failure
from proxy.exchange import Usage
from proxy.policies.spec import Deployment
from proxy.redaction import redact_url

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


# What to check when an upstream refuses without saying why (an empty or non-JSON body).
HINTS = {
    400: "it refused the request without saying why (its own log says why): check that "
    "api_base points at an OpenAI-compatible server and that it accepts this request's "
    "fields and headers",
    401: "check the deployment's api_key (litellm_params.api_key)",
    403: "check the deployment's api_key (litellm_params.api_key) and what it may access",
    404: "check litellm_params.api_base (OpenAI-compatible servers usually end in /v1) and "
    "litellm_params.model",
    405: "check litellm_params.api_base (OpenAI-compatible servers usually end in /v1)",
    413: "the request is larger than it accepts",
    429: "it is limiting the rate of requests; retry later",
}
HINT_5XX = "it failed on its side (its own log says why)"
HINT_OTHER = "its own log says why"


class UpstreamHTTPError(Failure):
    """The provider answered with an error status; `body` is what it said (both pass through
    to the client, in its wire's envelope)."""

    def __init__(
        self, status: int, body: bytes, headers: Mapping[str, str], upstream: str = ""
    ) -> None:
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.body = body
        self.headers = dict(headers)
        # Which upstream answered, for a message when its body says nothing usable:
        # "'alias' (provider/model at https://host/v1)".
        self.upstream = upstream
        # Fields the proxy adds to the body's error object (what recovery tried); none when
        # the provider's answer passes through unchanged.
        self.extra: dict[str, object] = {}

    def plain_message(self) -> str:
        """The client's error message when the body is not a JSON error: who answered, what
        it said (if anything) and what to check."""
        who = f"the upstream for {self.upstream}" if self.upstream else "the upstream"
        text = self.body[:500].decode("utf-8", "replace").strip()
        said = f": {text}" if text else " with an empty body"
        hint = HINTS.get(self.status) or (HINT_5XX if self.status >= 500 else HINT_OTHER)
        return f"{who} answered HTTP {self.status}{said}; {hint}"


def describe(deployment: Deployment) -> str:
    """ "'alias' (provider/model at base URL)", credentials in the URL hidden."""
    where = f" at {redact_url(deployment.base_url)}" if deployment.base_url else ""
    return f"'{deployment.alias}' ({deployment.model}{where})"


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

    def usage(self, data: dict[str, Any]) -> Usage | None:
        """What a reply of this upstream says it used (each wire reports it its own way)."""
        ...

    async def close(self) -> None: ...
