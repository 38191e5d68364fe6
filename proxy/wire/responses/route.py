"""OpenAI Responses surface: POST /v1/responses (JSON and SSE).

The stages rewrite the request's chat-shaped view (proxy/wire/responses/view.py); a
deployment that speaks Responses gets the client's body back with only what they changed, any
other the view as a Chat Completions request, its answer translated back.

`previous_response_id` names history that lives at the provider, so the proxy rewrites nothing
of such a request (the guards still apply). With API keys configured it must name a response
the caller's own owner created through the proxy (proxy/wire/responses/owners.py). Codex
sends `store: false` and its whole input every turn, which the proxy sees and rewrites.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from proxy.errors import NotFound, UpgradeRequired
from proxy.exchange import ClientRequest, Exchange
from proxy.flow import Flow
from proxy.http.auth import authenticate
from proxy.sessions.identity import owner_of, scoped, session_id
from proxy.state import CONFIG, STORE, VIEWS
from proxy.upstream.base import UpstreamHTTPError
from proxy.upstream.chat_only import is_chat_only
from proxy.wire.chat import replies as chat
from proxy.wire.chat.degraded import degraded_text
from proxy.wire.provider_objects import reasoning_by_id, refuse_responses_objects
from proxy.wire.responses import replies as responses
from proxy.wire.responses.owners import ResponseOwners, continues
from proxy.wire.responses.request import parse_responses_request
from proxy.wire.responses.stream import Relay
from proxy.wire.responses.view import ResponsesView
from proxy.wire.serve import (
    events_answer,
    json_answer,
    open_exchange,
    read_request,
    relay_stream,
    serve,
    upstream_error,
)

routes = web.RouteTableDef()
RESPONSES_ROUTE = "/v1/responses"  # also the `route` label of its metrics


@routes.post(RESPONSES_ROUTE)
async def create_response(request: web.Request) -> web.StreamResponse:
    config, key, raw = await read_request(request)
    body = parse_responses_request(raw)
    owner = owner_of(key, config.keys)
    # Tenants share the provider's account: each may name only responses it created.
    owners = ResponseOwners(request.app[STORE], owner) if key is not None else None
    if owners is not None and continues(body):
        await owners.check(body)
    cache_key = body.get("prompt_cache_key")
    identity = {"metadata": {"session_id": cache_key}}
    opening = lambda: ResponsesView.opening(body)  # noqa: E731 - only if no session id came
    session = session_id(request.headers, identity, key.name if key else None, opening)
    views, own = request.app[VIEWS], scoped(owner, session.name)
    view = ResponsesView.of(body, views.last(own))
    if owners is not None:  # stored items, files, containers named by id could be anyone's
        refuse_responses_objects(body, view.fresh)
        reasoning = reasoning_by_id(body, view.fresh)
        if view.references or reasoning:
            await owners.check_items(view.references, reasoning)
    views.keep(own, view, len(raw))
    ex = open_exchange(
        request,
        config,
        key,
        view.chat_body(),
        session,
        ClientRequest(
            route=RESPONSES_ROUTE,
            wire="responses",
            view=view,
            stream=body.get("stream") is True,
            wants_usage=True,
            body_bytes=len(raw),
            opaque_history=body.get("previous_response_id") is not None
            or body.get("conversation") is not None,
        ),
    )
    # A response made with `store: false` (Codex's every turn) cannot be continued: no record.
    recording = owners if body.get("store") is not False else None
    return await serve(request, ex, ResponsesWire(view, recording))


@routes.get(RESPONSES_ROUTE)
async def websocket_probe(request: web.Request) -> web.Response:
    """Codex (with `supports_websockets`) first tries a WebSocket upgrade here. 426 makes it
    fall back to HTTP at once; a 404 would cost it seven tries, a 400 the whole turn."""
    raise UpgradeRequired(
        "this proxy serves the Responses API over HTTP only: POST /v1/responses "
        "(the WebSocket transport is not offered)",
        code="websocket_not_supported",
    )


@routes.get(RESPONSES_ROUTE + "/{response_id}")
@routes.delete(RESPONSES_ROUTE + "/{response_id}")
@routes.get(RESPONSES_ROUTE + "/{response_id}/input_items")
@routes.post(RESPONSES_ROUTE + "/{response_id}/cancel")
async def stored_response(request: web.Request) -> web.Response:
    """Stored responses are the provider's, in an account every tenant shares: none is read,
    deleted or cancelled through the proxy. One answer for every id, so none is revealed."""
    authenticate(request, request.app[CONFIG].current.keys)
    response_id = request.match_info["response_id"][:256]
    raise NotFound(
        f"Response with id '{response_id}' not found: this proxy serves only "
        "POST /v1/responses; stored responses are not read, deleted or cancelled through it."
    )


class ResponsesWire:
    """Responses answers: a response object, its event stream, OpenAI-shaped errors."""

    def __init__(self, view: ResponsesView, owners: ResponseOwners | None) -> None:
        self.view = view
        self.replies = responses.Replies(view)
        self.owners = owners  # None: no keys, nothing recorded

    async def complete(self, ex: Exchange, flow: Flow) -> web.Response:
        reply = await flow.complete(ex, self.replies)
        if self.owners is not None and not ex.translated:
            await self.owners.record(reply.data)
        return json_answer(
            ex, responses.client_body(reply, ex.alias, ex.identity.request_id), reply.headers
        )

    async def stream(self, request: web.Request, ex: Exchange, flow: Flow) -> web.StreamResponse:
        if ex.translated:  # the chat reply is asked for whole, then sent as this wire's events
            reply = await flow.complete(ex, self.replies)
            message = responses.client_message(reply, ex.alias, ex.identity.request_id)
            return events_answer(ex, responses.response_events(message), reply.headers)
        ended = self.owners.record if self.owners is not None else None
        try:
            return await relay_stream(
                request, ex, flow, lambda r: Relay(request, ex, r, self.view, ended)
            )
        except UpstreamHTTPError as error:
            deployment = ex.deployment
            if error.status != 404 or deployment is None or not is_chat_only(deployment):
                raise
            # Its 404 just taught that the deployment serves no /v1/responses
            # (proxy/upstream/chat_only.py): nothing was sent to the client yet, so it is
            # asked again, as chat, whole.
            return await self.stream(request, ex, flow)

    def upstream_error(self, ex: Exchange, error: UpstreamHTTPError) -> web.Response:
        return upstream_error(ex, error, chat.passthrough_body(error, ex.identity.request_id))

    def degraded(self, ex: Exchange, error: Exception) -> web.Response:
        """A normal response that says the model is unavailable, in Responses' shape."""
        said = {
            "choices": [{"message": {"role": "assistant", "content": degraded_text(ex, error)}}]
        }
        response = responses.response_from_chat(said, ex.alias, ex.identity.request_id)
        headers = {"x-agentproxy-degraded": "true"}
        if ex.client.stream:
            return events_answer(ex, responses.response_events(response), headers)
        return json_answer(ex, orjson.dumps(response), headers)
