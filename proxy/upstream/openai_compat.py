"""The fast path: OpenAI-compatible providers over one pooled aiohttp client session."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from proxy.errors import UpstreamBadResponse, UpstreamTimeout, UpstreamUnreachable
from proxy.policies.spec import Deployment, ServerSettings
from proxy.redaction import redact_urls_in
from proxy.upstream.base import UpstreamHTTPError, UpstreamReply, forwarded_headers

MAX_ERROR_BODY = 1024 * 1024


def redact(body: bytes, secret: str | None) -> bytes:
    """Providers sometimes echo the key they were given; it must never reach the client."""
    if secret and len(secret) >= 4 and secret.encode() in body:
        return body.replace(secret.encode(), b"[redacted]")
    return body


class OpenAICompatUpstream:
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
        self, deployment: Deployment, body: dict[str, Any], request_id: str
    ) -> UpstreamReply:
        response = await self._post(deployment, body, request_id, stream=False)
        try:
            raw = await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._failure(deployment, exc, stream=False) from exc
        finally:
            response.release()
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise UpstreamBadResponse(
                f"upstream for '{deployment.alias}' sent a body that is not JSON "
                f"({len(raw)} bytes starting {raw[:60]!r})"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise UpstreamBadResponse(
                f"upstream for '{deployment.alias}' sent JSON that is not a chat completion"
            )
        return UpstreamReply(data, raw, forwarded_headers(response.headers))

    async def open_stream(
        self, deployment: Deployment, body: dict[str, Any], request_id: str
    ) -> SSEStream:
        response = await self._post(deployment, body, request_id, stream=True)
        return SSEStream(response, lambda exc: self._failure(deployment, exc, stream=True))

    async def _post(
        self, deployment: Deployment, body: dict[str, Any], request_id: str, *, stream: bool
    ) -> aiohttp.ClientResponse:
        payload = orjson.dumps({**body, "model": deployment.upstream_model})
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
            "X-Request-Id": request_id,
            **deployment.extra_headers,
        }
        if deployment.api_key:
            headers["Authorization"] = f"Bearer {deployment.api_key}"
        try:
            response = await self.session.post(
                f"{deployment.base_url}/chat/completions",
                data=payload,
                headers=headers,
                timeout=self._timeout(deployment, stream),
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._failure(deployment, exc, stream=stream) from exc
        if response.status >= 400:
            try:
                raw = await response.content.read(MAX_ERROR_BODY)
            except (TimeoutError, aiohttp.ClientError):
                raw = b""
            finally:
                response.release()
            raise UpstreamHTTPError(
                response.status,
                redact(raw, deployment.api_key),
                forwarded_headers(response.headers),
            )
        return response

    def _timeout(self, deployment: Deployment, stream: bool) -> aiohttp.ClientTimeout:
        settings: ServerSettings = self._settings()
        read = (stream and deployment.stream_timeout_s) or deployment.timeout_s
        return aiohttp.ClientTimeout(
            total=None,
            connect=settings.connect_timeout_s,
            sock_read=read or settings.read_timeout_s,
        )

    def _failure(self, deployment: Deployment, exc: BaseException, *, stream: bool) -> Exception:
        settings: ServerSettings = self._settings()
        name = deployment.alias
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return UpstreamTimeout(
                f"could not connect to the upstream for '{name}' within "
                f"{settings.connect_timeout_s:g}s; raise server.connect_timeout_s if it is slow "
                "to accept connections"
            )
        if isinstance(exc, asyncio.TimeoutError):
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
def _client_timeout(connect: float, read: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=None, connect=connect, sock_read=read)


async def _read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """An error body, but never an unbounded one."""
    body = bytearray()
    while len(body) < cap and (chunk := await response.content.readany()):
        body += chunk
    return bytes(body[:cap])


class SSEStream:
    """Splits an upstream SSE body into complete events as the bytes arrive."""

    def __init__(self, response: aiohttp.ClientResponse, failure: Any) -> None:
        self.response = response
        self.headers = forwarded_headers(response.headers)
        self._failure = failure

    async def events(self) -> AsyncIterator[list[bytes]]:
        buffer = b""
        try:
            async for chunk in self.response.content.iter_any():
                buffer += chunk
                if b"\r\n" in buffer:
                    buffer = buffer.replace(b"\r\n", b"\n")
                *complete, buffer = buffer.split(b"\n\n")
                batch = [event for event in complete if event]
                if batch:
                    yield batch
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._failure(exc) from exc
        if buffer.strip():
            yield [buffer.strip()]

    async def close(self) -> None:
        self.response.release()
