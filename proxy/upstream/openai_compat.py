"""The fast path: OpenAI-compatible providers over one pooled aiohttp client session."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson

from proxy.errors import (
    UpstreamBadResponse,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnreachable,
)
from proxy.exchange import Usage
from proxy.messages import CHAT
from proxy.policies.spec import Deployment, ServerSettings
from proxy.redaction import redact_urls_in
from proxy.request_id import is_uuid
from proxy.upstream.base import (
    UpstreamHTTPError,
    UpstreamReply,
    describe,
    forwarded_headers,
)
from proxy.upstream.sse import EventTooLarge, SSESplitter

MAX_ERROR_BODY = 1024 * 1024


REDACTED = b"[redacted]"


def redact(body: bytes, secret: str | None) -> bytes:
    """Providers sometimes echo the key they were given; it must never reach the client."""
    if secret and len(secret) >= 4 and secret.encode() in body:
        return body.replace(secret.encode(), REDACTED)
    return body


def secret_bytes(secret: str | None) -> bytes | None:
    """The key as it would appear in a body; None when there is none worth looking for."""
    return secret.encode() if secret and len(secret) >= 4 else None


def redact_events(batch: list[bytes], secret: bytes) -> list[bytes]:
    """A batch of whole SSE events without the key. A key spread over two events' deltas is
    not found (providers echo keys whole, in messages, not token by token)."""
    return [e.replace(secret, REDACTED) for e in batch]


class OpenAICompatUpstream:
    """Chat Completions over aiohttp. Subclasses speak another wire (each format's native
    upstream, proxy/wire/<format>/upstream.py) by saying where to post, how to authenticate
    and what a reply looks like."""

    path = "/chat/completions"
    reply_kind = "chat completion"
    wire = CHAT  # the wire format its replies are in

    @staticmethod
    def usage(data: dict[str, Any]) -> Usage | None:
        return Usage.of(data.get("usage"))

    def __init__(self, settings_source: Any) -> None:
        # `settings_source()` returns the live ServerSettings, so timeouts follow reloads.
        self._settings = settings_source
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
                # One session serves every client: provider cookies must not carry from one
                # tenant's call to the next (and the jar costs ~10% of a request's CPU).
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def complete(
        self,
        deployment: Deployment,
        body: dict[str, Any],
        request_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> UpstreamReply:
        response = await self._post(deployment, body, request_id, headers, stream=False)
        cap = self._settings().max_response_bytes
        try:
            raw = await read_capped(response, cap)
        except BaseException as exc:
            response.close()  # refused, failed or the client left: abandon the rest, never drain
            if isinstance(exc, BodyTooLarge):
                raise UpstreamTooLarge(
                    f"the upstream for '{deployment.alias}' sent a response larger than "
                    f"server.max_response_bytes ({_size(cap)}); raise server.max_response_bytes "
                    "if its answers are really this large"
                ) from None
            if isinstance(exc, TimeoutError | aiohttp.ClientError):
                raise self._failure(deployment, exc, stream=False) from exc
            raise
        response.release()
        raw = redact(raw, deployment.api_key)
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise UpstreamBadResponse(
                f"upstream for '{deployment.alias}' sent a body that is not JSON "
                f"({len(raw)} bytes starting {raw[:60]!r})"
            ) from None
        if not isinstance(data, dict) or not self.is_reply(data):
            raise UpstreamBadResponse(
                f"upstream for '{deployment.alias}' sent JSON that is not a {self.reply_kind}"
            )
        return UpstreamReply(data, raw, forwarded_headers(response.headers))

    @staticmethod
    def is_reply(data: dict[str, Any]) -> bool:
        return isinstance(data.get("choices"), list)

    def url(self, deployment: Deployment) -> str:
        return f"{deployment.base_url}{self.path}"

    def posting(
        self, deployment: Deployment, body: dict[str, Any], stream: bool
    ) -> tuple[str, bytes]:
        """Where to post and what: the body naming the deployment's model (a wire whose URL
        names the model says so otherwise)."""
        return self.url(deployment), orjson.dumps({**body, "model": deployment.upstream_model})

    def auth_headers(self, deployment: Deployment) -> dict[str, str]:
        return {"Authorization": f"Bearer {deployment.api_key}"} if deployment.api_key else {}

    async def open_stream(
        self,
        deployment: Deployment,
        body: dict[str, Any],
        request_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> SSEStream:
        response = await self._post(deployment, body, request_id, headers, stream=True)
        return SSEStream(
            response,
            lambda exc: self._failure(deployment, exc, stream=True),
            deployment.alias,
            self._settings().max_event_bytes,
            secret_bytes(deployment.api_key),
        )

    async def _post(
        self,
        deployment: Deployment,
        body: dict[str, Any],
        request_id: str,
        passed: Mapping[str, str] | None,
        *,
        stream: bool,
    ) -> aiohttp.ClientResponse:
        url, payload = self.posting(deployment, body, stream)
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
            **({"X-Request-Id": request_id} if is_uuid(request_id) else {}),
            **(passed or {}),  # the client's protocol headers (anthropic-version, -beta)
            **deployment.extra_headers,
            **self.auth_headers(deployment),
        }
        try:
            response = await self.session.post(
                url,
                data=payload,
                headers=headers,
                timeout=self._timeout(deployment, stream),
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._failure(deployment, exc, stream=stream) from exc
        if response.status >= 400:
            raw = await _error_body(response, self._settings().response_timeout_s)
            raise UpstreamHTTPError(
                response.status,
                redact(raw, deployment.api_key),
                forwarded_headers(response.headers),
                describe(deployment),
            )
        return response

    def _timeout(self, deployment: Deployment, stream: bool) -> aiohttp.ClientTimeout:
        settings: ServerSettings = self._settings()
        read = (stream and deployment.stream_timeout_s) or deployment.timeout_s
        # A stream may run as long as it keeps talking; a non-streaming reply has a total.
        total = None if stream else settings.response_timeout_s
        return _client_timeout(settings.connect_timeout_s, read or settings.read_timeout_s, total)

    def _failure(self, deployment: Deployment, exc: BaseException, *, stream: bool) -> Exception:
        settings: ServerSettings = self._settings()
        name = deployment.alias
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return UpstreamTimeout(
                f"could not connect to the upstream for '{name}' within "
                f"{settings.connect_timeout_s:g}s; raise server.connect_timeout_s if it is slow "
                "to accept connections"
            )
        if isinstance(exc, TimeoutError) and not (
            stream or isinstance(exc, aiohttp.ServerTimeoutError)
        ):  # not silence but the total: server.response_timeout_s
            return UpstreamTimeout(
                f"the upstream for '{name}' did not finish its reply within "
                f"{settings.response_timeout_s:g}s; raise server.response_timeout_s if this "
                "model's non-streaming answers take longer (or stream them)"
            )
        if isinstance(exc, TimeoutError):
            read = (stream and deployment.stream_timeout_s) or deployment.timeout_s
            which = (
                f"litellm_params.{'stream_timeout' if stream else 'timeout'} of '{name}'"
                if read
                else "server.read_timeout_s"
            )
            limit = read or settings.read_timeout_s
            return UpstreamTimeout(
                f"the upstream for '{name}' sent nothing for {limit:g}s; raise {which} "
                "if this model needs longer"
            )
        return UpstreamUnreachable(
            # aiohttp's errors may quote the URL, with the api_base's credentials in it.
            f"the upstream for '{name}' is unreachable: "
            f"{type(exc).__name__}: {redact_urls_in(str(exc))}"
        )


@functools.lru_cache(maxsize=64)
def _client_timeout(connect: float, read: float, total: float | None) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=total, connect=connect, sock_read=read)


class BodyTooLarge(Exception):
    pass


async def read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """The whole body, checked against `cap` as the bytes arrive: never more than the cap and
    one chunk is held. A declared Content-Length over the cap is refused before any read."""
    if response.content_length is not None and response.content_length > cap:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while chunk := await response.content.readany():
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _error_body(response: aiohttp.ClientResponse, time_limit: float) -> bytes:
    """An error body to pass on: its first MAX_ERROR_BODY bytes, read for at most
    `time_limit` seconds; whatever arrived by then."""
    body = bytearray()
    try:
        async with asyncio.timeout(time_limit):
            while len(body) < MAX_ERROR_BODY and (chunk := await response.content.readany()):
                body += chunk
    except (TimeoutError, aiohttp.ClientError):
        pass
    finally:
        if response.content.at_eof():
            response.release()  # read whole: the connection goes back to the pool
        else:
            response.close()  # the rest is not wanted: never drain it
    return bytes(body[:MAX_ERROR_BODY])


def _size(limit: int) -> str:
    mib = limit / (1024 * 1024)
    return f"{mib:g} MiB" if mib >= 1 and mib == int(mib) else f"{limit} bytes"


class SSEStream:
    """Splits an upstream SSE body into complete events as the bytes arrive."""

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        failure: Any,
        alias: str,
        max_event_bytes: int,
        secret: bytes | None = None,
    ) -> None:
        self.response = response
        self._secret = secret  # the deployment's key, never relayed
        self.headers = forwarded_headers(response.headers)
        self._failure = failure
        self._alias = alias
        self._max_event_bytes = max_event_bytes
        self._finished = False

    async def events(self) -> AsyncIterator[list[bytes]]:
        splitter = SSESplitter(self._max_event_bytes)
        secret = self._secret
        try:
            async for chunk in self.response.content.iter_any():
                held = splitter.holding
                batch = splitter.feed(chunk)
                if batch:
                    if secret is not None and (
                        secret in chunk or (held and secret in batch[0])
                    ):  # one search per read; the first event may hold earlier reads' bytes
                        batch = redact_events(batch, secret)
                    yield batch
        except EventTooLarge:
            raise UpstreamTooLarge(
                f"the upstream for '{self._alias}' sent a stream event larger than "
                f"server.max_event_bytes ({_size(self._max_event_bytes)}) without ending it; "
                "raise server.max_event_bytes if its events are really this large"
            ) from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._failure(exc) from exc
        self._finished = True
        last = splitter.rest()
        if last:
            yield [last] if secret is None or secret not in last else redact_events([last], secret)

    async def close(self) -> None:
        if self._finished:
            self.response.release()  # read to its end: the connection goes back to the pool
        else:
            self.response.close()  # abandoned (client gone, refused, failed): never drain it
