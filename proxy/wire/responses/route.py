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

from typing import Any

import orjson
from aiohttp import web

from proxy.errors import BadRequest, NotFound, UpgradeRequired
from proxy.exchange import ClientContext, ClientRequest, Exchange, NativeFit, NativePrefix
from proxy.flow import Flow
from proxy.http.auth import authenticate
from proxy.pipeline.base import StageContext
from proxy.pipeline.compaction.budget import tokens_of
from proxy.policies.spec import ApiKey, Deployment, Keys
from proxy.sessions.identity import SessionName, owner_of, session_id
from proxy.state import CONFIG, FACTS, FLOW, STORE, TURN_MEMORY
from proxy.store.base import Store
from proxy.upstream.base import UpstreamHTTPError
from proxy.wire.chat import replies as chat
from proxy.wire.chat.degraded import degraded_text
from proxy.wire.provider_objects import reasoning_by_id, refuse_responses_objects
from proxy.wire.responses import compaction
from proxy.wire.responses import replies as responses
from proxy.wire.responses.compaction_items import read
from proxy.wire.responses.memory import ResponsesMemory
from proxy.wire.responses.owners import ResponseOwners, continues
from proxy.wire.responses.request import parse_responses_request
from proxy.wire.responses.stream import Relay
from proxy.wire.responses.upstream import no_responses, speaks_responses
from proxy.wire.responses.view import KEPT_ROLES, ResponsesView, compact_threshold
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
COMPACT_ROUTE = "/v1/responses/compact"


@routes.post(RESPONSES_ROUTE)
async def create_response(request: web.Request) -> web.StreamResponse:
    config, key, raw = await read_request(request)
    body = parse_responses_request(raw)
    owner, owners, session = await _opened(request, key, config.keys, body)
    memory = request.app[TURN_MEMORY]
    lent = memory.recall(owner, session.name, ResponsesMemory)
    view = ResponsesView.of(body, lent, request.app[FACTS])
    await _check_input(request, view, owner, owners)
    memory.keep(owner, session.name, view.memory(), len(raw))
    ex = open_exchange(
        request,
        config,
        key,
        view.chat_body(),
        session,
        ClientRequest(
            route=RESPONSES_ROUTE,
            wire="responses",
            renderer=view,
            native=view,
            stream=body.get("stream") is True,
            wants_usage=True,
            body_bytes=len(raw),
            opaque_history=body.get("previous_response_id") is not None
            or body.get("conversation") is not None,
            # Its own compaction state or instruction: the proxy's compaction yields to it.
            context=ClientContext(manages=True) if view.client_manages_context else None,
        ),
    )
    # A response made with `store: false` (Codex's every turn) cannot be continued: no record.
    recording = owners if body.get("store") is not False else None
    ctx = request.app[FLOW].rewriter.ctx
    return await serve(request, ex, ResponsesWire(view, recording, ctx))


async def _opened(
    request: web.Request, key: ApiKey | None, keys: Keys, body: dict[str, Any]
) -> tuple[str, ResponseOwners | None, SessionName]:
    """What both routes open with: the caller's owner; with keys configured, the record of
    whose each response is (tenants share the provider's account: each may name only the
    responses it created, checked here for `previous_response_id`); the session."""
    owner = owner_of(key, keys)
    owners = ResponseOwners(request.app[STORE], owner) if key is not None else None
    if owners is not None and continues(body):
        await owners.check(body)
    identity = {"metadata": {"session_id": body.get("prompt_cache_key")}}
    opening = lambda: ResponsesView.opening(body)  # noqa: E731 - only if no session id came
    return owner, owners, session_id(request.headers, identity, key.name if key else None, opening)


async def _check_input(
    request: web.Request, view: ResponsesView, owner: str, owners: ResponseOwners | None
) -> None:
    """The input items a tenant may send (stored items, files, containers named by id could
    be anyone's; a reasoning item must be its own), among those the view mapped this turn (a
    lent prefix was checked on its own turn); then the proxy's compaction items read into
    their summaries."""
    body = view.body
    if owners is not None:
        refuse_responses_objects(body, view.fresh)
        reasoning = reasoning_by_id(body, view.fresh)
        if view.references or reasoning:
            await owners.check_items(view.references, reasoning)
    await read_summaries(view, request.app[STORE], owner)


async def read_summaries(view: ResponsesView, store: Store, owner: str) -> None:
    """The summaries the proxy's compaction items in the input stand for, into their view
    messages (a forged or another tenant's item: 400, naming its index)."""
    for index, item, message in view.compactions:
        message["content"] = (await read(store, owner, item, index)).text


@routes.post(COMPACT_ROUTE)
async def compact_response(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses/compact: the provider's own where the deployment serves Responses,
    else the proxy's summarizer (proxy/wire/responses/compaction.py)."""
    config, key, raw = await read_request(request)
    body = parse_responses_request(raw)
    owner, owners, session = await _opened(request, key, config.keys, body)
    view = ResponsesView.of(body, facts=request.app[FACTS])  # its own: nothing lent or kept
    await _check_input(request, view, owner, owners)  # every item: none was lent
    compact = CompactView(view)
    ex = open_exchange(
        request,
        config,
        key,
        view.chat_body(),
        session,
        ClientRequest(
            route=COMPACT_ROUTE,
            wire=CompactView.wire,
            renderer=compact,
            native=compact,
            body_bytes=len(raw),
            opaque_history=True,  # compacted as sent: no stage rewrites it first
        ),
    )
    return await serve(request, ex, CompactWire(view, request.app[FLOW].rewriter.ctx))


class CompactView:
    """A compact request as control sends it: the client's body (the proxy's own compaction
    items read into summaries) to a deployment that serves Responses; no other is sent one."""

    wire = "responses_compact"  # its native upstream: proxy/wire/responses/upstream.py

    def __init__(self, view: ResponsesView) -> None:
        self.view = view

    def native_for(self, deployment: Deployment) -> bool:
        return speaks_responses(deployment, self.view.facts)

    def render(self, chat: dict[str, Any]) -> dict[str, Any]:
        return self.view.render(chat)

    def translated(self, chat: dict[str, Any]) -> dict[str, Any]:
        raise BadRequest(  # never sent: CompactWire compacts itself for such a deployment
            "this deployment does not serve /v1/responses/compact", code="unsupported_route"
        )

    def reasoning(self) -> list[dict[str, Any]]:
        return self.view.reasoning()

    def output_limit(self) -> int | None:
        return None

    def fit(self, fit: NativeFit) -> None:
        self.view.fit(fit)

    def native_prefix(self) -> NativePrefix:
        return self.view.native_prefix()


class CompactWire:
    """The answers of POST /v1/responses/compact (never streamed)."""

    def __init__(self, view: ResponsesView, ctx: StageContext) -> None:
        self.view = view
        self.ctx = ctx

    async def complete(self, ex: Exchange, flow: Flow) -> web.Response:
        deployment = ex.deployment
        if deployment is not None and speaks_responses(deployment, self.view.facts):
            reply = await flow.control.call(ex, stream=False)
            return json_answer(ex, reply.body, reply.headers)
        if ex.client.opaque_history and (
            self.view.body.get("previous_response_id") or self.view.body.get("conversation")
        ):
            raise BadRequest(
                "only the provider can compact history it keeps (previous_response_id, "
                "conversation): send the input itself to compact it on this model",
                param="previous_response_id",
            )
        item, _ = await compaction.compact(ex, self.ctx, ex.messages)
        items = self.view.render(ex.body).get("input")
        window = compaction.compacted_window(
            ex, items if isinstance(items, list) else [], item, ex.identity.request_id
        )
        return json_answer(ex, orjson.dumps(window), {})

    async def stream(self, request: web.Request, ex: Exchange, flow: Flow) -> web.StreamResponse:
        return await self.complete(ex, flow)

    def upstream_error(self, ex: Exchange, error: UpstreamHTTPError) -> web.Response:
        return upstream_error(ex, error, chat.passthrough_body(error, ex.identity.request_id))

    def degraded(self, ex: Exchange, error: Exception) -> web.Response:
        raise error


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

    def __init__(
        self, view: ResponsesView, owners: ResponseOwners | None, ctx: StageContext
    ) -> None:
        self.view = view
        self.replies = responses.Replies(view)
        self.owners = owners  # None: no keys, nothing recorded
        self.ctx = ctx  # the proxy's own compaction, for a deployment that cannot do it

    async def complete(self, ex: Exchange, flow: Flow) -> web.Response:
        if ex.translated:
            message, headers = await self.translated(ex, flow)
            return json_answer(ex, orjson.dumps(message), headers)
        reply = await flow.complete(ex, self.replies)
        if self.owners is not None:
            await self.owners.record(reply.data)
        if any(i.get("type") == "compaction" for i in reply.data.get("output") or ()):
            self.ctx.metrics.child(self.ctx.metrics.context_edits, "compaction", "provider").inc()
        return json_answer(
            ex, responses.client_body(reply, ex.alias, ex.identity.request_id), reply.headers
        )

    async def translated(self, ex: Exchange, flow: Flow) -> tuple[dict[str, Any], Any]:
        """The answer from a deployment that speaks no Responses (asked as chat, whole), the
        client's compaction carried out by the proxy: Codex's trigger answered with the item
        alone; past a `context_management` threshold, the item first, then the answer to the
        compacted window."""
        request_id = ex.identity.request_id
        if compaction.is_triggered(self.view.body):
            alone, _ = await compaction.compact(ex, self.ctx, ex.messages)
            return compaction.compaction_response(ex, alone, request_id), {}
        threshold = compact_threshold(self.view.body)
        item: dict[str, Any] | None = None
        if threshold is not None and tokens_of(ex.messages) > threshold:
            item, summary = await compaction.compact(ex, self.ctx, ex.messages)
            kept = [m for m in ex.messages if m.get("role") in KEPT_ROLES]
            ex.body["messages"] = [*kept, {"role": "user", "content": summary}]
        reply = await flow.complete(ex, self.replies)
        message = responses.client_message(reply, ex.alias, request_id)
        if item is not None:
            message["output"] = [item, *message["output"]]
        return message, reply.headers

    async def stream(self, request: web.Request, ex: Exchange, flow: Flow) -> web.StreamResponse:
        if ex.translated:  # the chat reply is asked for whole, then sent as this wire's events
            message, headers = await self.translated(ex, flow)
            return events_answer(ex, responses.response_events(message), headers)
        ended = self.owners.record if self.owners is not None else None
        try:
            return await relay_stream(
                request, ex, flow, lambda r: Relay(request, ex, r, self.view, ended)
            )
        except UpstreamHTTPError as error:
            deployment = ex.deployment
            learnt = no_responses(self.view.facts)
            if error.status != 404 or deployment is None or not learnt.lacked_by(deployment):
                raise
            # Its 404 just taught that the deployment serves no /v1/responses
            # (upstream.no_responses): nothing was sent to the client yet, so it is
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
