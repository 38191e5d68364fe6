"""Anthropic surface: POST /v1/messages (JSON and SSE; Claude Code's `?beta=true` too) and
POST /v1/messages/count_tokens.

The stages rewrite the request's chat-shaped view (proxy/dialects/anthropic_view.py); an
Anthropic deployment gets the client's body back with only what they changed, any other
deployment the view as a Chat Completions request, its answer translated back.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from proxy.auth import authenticate
from proxy.dialects import anthropic
from proxy.dialects.anthropic_stream import Relay, message_stream
from proxy.dialects.anthropic_view import AnthropicView
from proxy.dialects.chat_degraded import TEXT as DEGRADED_TEXT
from proxy.exchange import Exchange
from proxy.flow import Flow
from proxy.middleware import CLIENT_GONE
from proxy.pipeline.compaction.budget import schema_tokens, tokens_of
from proxy.routes.body import read_body
from proxy.routes.messages_request import parse_messages_request
from proxy.routes.serve import open_exchange, proxy_headers, serve
from proxy.session import session_id
from proxy.state import CONFIG
from proxy.upstream.anthropic import DEFAULT_VERSION, speaks_anthropic
from proxy.upstream.base import UpstreamHTTPError

routes = web.RouteTableDef()
MESSAGES_ROUTE = "/v1/messages"  # also the `route` label of its metrics
# The client's protocol headers, passed on to an Anthropic upstream as they came.
PASSED_HEADERS = ("anthropic-version", "anthropic-beta")


@routes.post(MESSAGES_ROUTE)
async def messages(request: web.Request) -> web.StreamResponse:
    ex = await _exchange(request)
    return await serve(request, ex, AnthropicWire(ex))


@routes.post("/v1/messages/count_tokens")
async def count_tokens(request: web.Request) -> web.Response:
    """The proxy's estimate of the prompt as the client sent it (what the rewrites then do
    depends on the session's state): enough for a client's own context bookkeeping."""
    ex = await _exchange(request, counting=True)
    tokens = tokens_of(ex.messages) + schema_tokens(ex.body.get("tools"))
    return web.json_response({"input_tokens": tokens}, headers=proxy_headers(ex))


async def _exchange(request: web.Request, *, counting: bool = False) -> Exchange:
    config = request.app[CONFIG].current
    key = authenticate(request, config.keys)
    raw = await read_body(request, config.server.max_body_bytes, config.server.body_timeout_s)
    body = parse_messages_request(raw, counting=counting)
    view = AnthropicView.of(body)
    chat = view.chat_body()
    identity = {"metadata": body.get("metadata"), "messages": view.messages}
    session = session_id(request.headers, identity, key.name if key else None)
    headers = {name: request.headers[name] for name in PASSED_HEADERS if name in request.headers}
    headers.setdefault("anthropic-version", DEFAULT_VERSION)
    return open_exchange(
        request,
        config,
        key,
        chat,
        session,
        stream=body.get("stream") is True,
        client_wants_usage=True,
        body_bytes=len(raw),
        route=MESSAGES_ROUTE,
        wire="anthropic",
        view=view,
        forward_headers=headers,
    )


class AnthropicWire:
    """Anthropic answers: a message, its event stream, errors in Anthropic's envelope."""

    def __init__(self, ex: Exchange) -> None:
        assert isinstance(ex.view, AnthropicView)
        self.view = ex.view
        self.replies = anthropic.Replies(ex.view)

    async def complete(self, ex: Exchange, flow: Flow) -> web.Response:
        reply = await flow.complete(ex, self.replies)
        return web.Response(
            body=anthropic.client_body(reply, ex.alias, ex.request_id),
            content_type="application/json",
            headers={**reply.headers, **proxy_headers(ex), "server-timing": ex.server_timing()},
        )

    async def stream(self, request: web.Request, ex: Exchange, flow: Flow) -> web.StreamResponse:
        if ex.deployment is not None and not speaks_anthropic(ex.deployment):
            # Translated: the chat reply is asked for whole, then sent as Anthropic's events.
            reply = await flow.complete(ex, self.replies)
            message = orjson.loads(anthropic.client_body(reply, ex.alias, ex.request_id))
            return web.Response(
                body=message_stream(message),
                content_type="text/event-stream",
                headers={**reply.headers, **proxy_headers(ex), "server-timing": ex.server_timing()},
            )
        source = await flow.open_stream(ex)
        response = web.StreamResponse(
            headers={
                **source.headers,
                **proxy_headers(ex),
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "x-request-id": ex.request_id,
            }
        )
        relay = Relay(request, ex, response, self.view)
        try:
            await flow.relay(ex, source, relay)
            await relay.end()
        except ConnectionResetError:
            request[CLIENT_GONE] = True
        return response

    def upstream_error(self, ex: Exchange, error: UpstreamHTTPError) -> web.Response:
        return web.Response(
            status=error.status,
            body=anthropic.passthrough_body(error, ex.request_id),
            content_type="application/json",
            headers={**error.headers, **proxy_headers(ex)},
        )

    def degraded(self, ex: Exchange, error: Exception) -> web.Response:
        reason = (
            f"upstream answered {error.status}"
            if isinstance(error, UpstreamHTTPError)
            else getattr(error, "code", None) or type(error).__name__
        )
        tried = ", ".join(ex.recovery.recoveries()) or "one attempt"
        text = DEGRADED_TEXT.format(reason=reason, tried=tried)
        message = anthropic.degraded_message(ex.alias, ex.request_id, text)
        headers = {**proxy_headers(ex), "x-agentproxy-degraded": "true"}
        if ex.stream:
            body = message_stream(message)
            return web.Response(body=body, content_type="text/event-stream", headers=headers)
        return web.json_response(message, headers=headers)
