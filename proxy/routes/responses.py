"""OpenAI Responses surface: POST /v1/responses (JSON and SSE).

The stages rewrite the request's chat-shaped view (proxy/dialects/responses_view.py); a
deployment that speaks Responses gets the client's body back with only what they changed, any
other the view as a Chat Completions request, its answer translated back.

`previous_response_id` is passed through untouched: the history it names lives at the
provider, so the proxy rewrites nothing of the request (the guards still apply). Codex sends
`store: false` and its whole input every turn, which the proxy sees and rewrites.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from proxy.auth import authenticate
from proxy.dialects import chat, responses
from proxy.dialects.chat_degraded import degraded_text
from proxy.dialects.responses_stream import Relay
from proxy.dialects.responses_view import ResponsesView
from proxy.errors import UpgradeRequired
from proxy.exchange import Exchange
from proxy.flow import Flow
from proxy.routes.body import read_body
from proxy.routes.responses_request import parse_responses_request
from proxy.routes.serve import (
    events_answer,
    json_answer,
    open_exchange,
    relay_stream,
    serve,
    upstream_error,
)
from proxy.session import owner_of, scoped, session_id
from proxy.state import CONFIG, VIEWS
from proxy.upstream.base import UpstreamHTTPError

routes = web.RouteTableDef()
RESPONSES_ROUTE = "/v1/responses"  # also the `route` label of its metrics


@routes.post(RESPONSES_ROUTE)
async def create_response(request: web.Request) -> web.StreamResponse:
    config = request.app[CONFIG].current
    key = authenticate(request, config.keys)
    raw = await read_body(request, config.server.max_body_bytes, config.server.body_timeout_s)
    body = parse_responses_request(raw)
    cache_key = body.get("prompt_cache_key")
    identity = {"metadata": {"session_id": cache_key}}
    opening = lambda: ResponsesView.opening(body)  # noqa: E731 - only if no session id came
    session = session_id(request.headers, identity, key.name if key else None, opening)
    views, own = request.app[VIEWS], scoped(owner_of(key, config.keys), session.name)
    view = ResponsesView.of(body, views.last(own))
    views.keep(own, view, len(raw))
    ex = open_exchange(
        request,
        config,
        key,
        view.chat_body(),
        session,
        stream=body.get("stream") is True,
        client_wants_usage=True,
        body_bytes=len(raw),
        route=RESPONSES_ROUTE,
        wire="responses",
        view=view,
        opaque_history=body.get("previous_response_id") is not None,
    )
    return await serve(request, ex, ResponsesWire(view))


@routes.get(RESPONSES_ROUTE)
async def websocket_probe(request: web.Request) -> web.Response:
    """Codex (with `supports_websockets`) first tries a WebSocket upgrade here. 426 makes it
    fall back to HTTP at once; a 404 would cost it seven tries, a 400 the whole turn."""
    raise UpgradeRequired(
        "this proxy serves the Responses API over HTTP only: POST /v1/responses "
        "(the WebSocket transport is not offered)",
        code="websocket_not_supported",
    )


class ResponsesWire:
    """Responses answers: a response object, its event stream, OpenAI-shaped errors."""

    def __init__(self, view: ResponsesView) -> None:
        self.view = view
        self.replies = responses.Replies(view)

    async def complete(self, ex: Exchange, flow: Flow) -> web.Response:
        reply = await flow.complete(ex, self.replies)
        return json_answer(ex, responses.client_body(reply, ex.alias, ex.request_id), reply.headers)

    async def stream(self, request: web.Request, ex: Exchange, flow: Flow) -> web.StreamResponse:
        if ex.translated:  # the chat reply is asked for whole, then sent as this wire's events
            reply = await flow.complete(ex, self.replies)
            message = responses.client_message(reply, ex.alias, ex.request_id)
            return events_answer(ex, responses.response_events(message), reply.headers)
        return await relay_stream(request, ex, flow, lambda r: Relay(request, ex, r, self.view))

    def upstream_error(self, ex: Exchange, error: UpstreamHTTPError) -> web.Response:
        return upstream_error(ex, error, chat.passthrough_body(error, ex.request_id))

    def degraded(self, ex: Exchange, error: Exception) -> web.Response:
        """A normal response that says the model is unavailable, in Responses' shape."""
        said = {
            "choices": [{"message": {"role": "assistant", "content": degraded_text(ex, error)}}]
        }
        response = responses.response_from_chat(said, ex.alias, ex.request_id)
        headers = {"x-agentproxy-degraded": "true"}
        if ex.stream:
            return events_answer(ex, responses.response_events(response), headers)
        return json_answer(ex, orjson.dumps(response), headers)
