"""OpenAI surface: POST /v1/chat/completions (JSON and SSE), and its list of models."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.exchange import ClientRequest, Exchange
from proxy.flow import Flow
from proxy.http.headers import proxy_headers
from proxy.policies.spec import Config
from proxy.sessions.identity import session_id
from proxy.state import FACTS
from proxy.upstream.base import UpstreamHTTPError, UpstreamStream
from proxy.wire.chat import degraded as chat_degraded
from proxy.wire.chat import replies as chat
from proxy.wire.chat.request import parse_chat_request
from proxy.wire.chat.stream import Relay
from proxy.wire.chat_as_responses import ChatAsResponses, ChatReplies, as_chat
from proxy.wire.chat_as_responses_stream import chat_stream
from proxy.wire.provider_objects import refuse_chat_objects
from proxy.wire.serve import (
    json_answer,
    open_exchange,
    read_request,
    relay_stream,
    serve,
    upstream_error,
)

routes = web.RouteTableDef()
CHAT_ROUTE = "/v1/chat/completions"  # also the `route` label of its metrics


@routes.post(CHAT_ROUTE)
async def chat_completions(request: web.Request) -> web.StreamResponse:
    config, key, raw = await read_request(request)
    body = parse_chat_request(raw)
    if key is not None:  # tenants share the provider's account: none names its files by id
        refuse_chat_objects(body, raw)
    stream = body.get("stream") is True
    options = body.get("stream_options") or {}
    session = session_id(request.headers, body, key.name if key else None)
    ex = open_exchange(
        request,
        config,
        key,
        body,
        session,
        ClientRequest(
            route=CHAT_ROUTE,
            stream=stream,
            wants_usage=bool(options.get("include_usage")),
            body_bytes=len(raw),
            # To a deployment that serves only /v1/responses.
            alternate=ChatAsResponses(request.app[FACTS]),
        ),
    )
    if stream and not ex.client.wants_usage:
        # Ask for usage so every streamed call is accounted; that chunk is dropped on the way out.
        body["stream_options"] = {**options, "include_usage": True}
    return await serve(request, ex, ChatWire())


class ChatWire:
    """Chat Completions answers: JSON, SSE, provider errors and degraded answers."""

    async def complete(self, ex: Exchange, flow: Flow) -> web.Response:
        reply = as_chat(await flow.complete(ex, ChatReplies(ex, chat)), ex.alias)
        return json_answer(ex, reply.body, reply.headers)

    async def stream(self, request: web.Request, ex: Exchange, flow: Flow) -> web.StreamResponse:
        return await relay_stream(request, ex, flow, lambda r: ChatRelay(request, ex, r))

    def upstream_error(self, ex: Exchange, error: UpstreamHTTPError) -> web.Response:
        """Provider errors pass through unchanged when they are JSON (anything else is
        wrapped), plus what recovery tried when it tried anything."""
        return upstream_error(ex, error, chat.passthrough_body(error, ex.identity.request_id))

    def degraded(self, ex: Exchange, error: Exception) -> web.Response:
        return chat_degraded.answer(ex, error, proxy_headers(ex))


class ChatRelay(Relay):
    """The chat relay, over Responses events read as chat chunks when the request went as
    Responses (proxy/wire/chat_as_responses.py)."""

    async def _relay(self, source: UpstreamStream) -> Any:
        return await super()._relay(chat_stream(self.ex, source))


def model_list(config: Config, aliases: list[str]) -> dict[str, Any]:
    """GET /v1/models in OpenAI's shape (proxy/wire/models.py serves it)."""
    data = [
        {"id": alias, "object": "model", "created": 0, "owned_by": "agentproxy"}
        for alias in aliases
    ]
    return {"object": "list", "data": data}
