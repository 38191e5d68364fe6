"""Anthropic surface: POST /v1/messages (JSON and SSE; Claude Code's `?beta=true` too) and
POST /v1/messages/count_tokens.

The stages rewrite the request's chat-shaped view (proxy/wire/anthropic/view.py); an
Anthropic deployment gets the client's body back with only what they changed, any other
deployment the view as a Chat Completions request, its answer translated back.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.exchange import ClientRequest, Exchange
from proxy.flow import Flow
from proxy.http.headers import proxy_headers
from proxy.pipeline.compaction.budget import schema_tokens, tokens_of
from proxy.pipeline.context_edits import STAGE as CONTEXT_STAGE
from proxy.sessions.identity import owner_of, session_id
from proxy.sessions.turn_memory import TurnMemory
from proxy.state import FLOW, TURN_MEMORY
from proxy.upstream.base import UpstreamHTTPError, UpstreamReply
from proxy.wire.anthropic import replies as anthropic
from proxy.wire.anthropic.context import (
    answered,
    betas_needed,
    cleared_thinking,
    client_context,
    provider_edits,
)
from proxy.wire.anthropic.memory import AnthropicMemory
from proxy.wire.anthropic.request import parse_messages_request
from proxy.wire.anthropic.stream import Relay, message_stream
from proxy.wire.anthropic.thinking import remember, remembered
from proxy.wire.anthropic.upstream import DEFAULT_VERSION
from proxy.wire.anthropic.view import AnthropicView, ThinkingRepair
from proxy.wire.chat.degraded import degraded_text
from proxy.wire.provider_objects import refuse_messages_objects
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
MESSAGES_ROUTE = "/v1/messages"  # also the `route` label of its metrics
# The client's protocol headers, passed on to an Anthropic upstream as they came.
PASSED_HEADERS = ("anthropic-version", "anthropic-beta")


@routes.post(MESSAGES_ROUTE)
async def messages(request: web.Request) -> web.StreamResponse:
    ex = await _exchange(request)
    return await serve(request, ex, AnthropicWire(ex, request.app[TURN_MEMORY]))


@routes.post("/v1/messages/count_tokens")
async def count_tokens(request: web.Request) -> web.Response:
    """The proxy's estimate of the prompt as the client sent it (what the rewrites then do
    depends on the session's state): enough for a client's own context bookkeeping."""
    ex = await _exchange(request, counting=True)
    tokens = tokens_of(ex.messages) + schema_tokens(ex.body.get("tools"))
    return web.json_response({"input_tokens": tokens}, headers=proxy_headers(ex))


async def _exchange(request: web.Request, *, counting: bool = False) -> Exchange:
    config, key, raw = await read_request(request)
    body = parse_messages_request(raw, counting=counting)
    identity = {"metadata": body.get("metadata")}
    opening = lambda: AnthropicView.opening(body)  # noqa: E731 - only if no session id came
    session = session_id(request.headers, identity, key.name if key else None, opening)
    owner = owner_of(key, config.keys)
    memory = request.app[TURN_MEMORY]
    view = AnthropicView.of(body, memory.recall(owner, session.name, AnthropicMemory))
    view.memory_session = session.name  # the relayed thinking is written where it is read
    if key is not None:  # tenants share the provider's account: its stored objects too
        refuse_messages_objects(body, view.fresh)
    repair = None if counting else view.thinking_repair(remembered(memory, owner, session.name))
    chat = view.chat_body()
    context = client_context(body, view.cut is not None)
    headers = {name: request.headers[name] for name in PASSED_HEADERS if name in request.headers}
    headers.setdefault("anthropic-version", DEFAULT_VERSION)
    if context is not None and (betas := betas_needed(body, headers.get("anthropic-beta"))):
        headers["anthropic-beta"] = betas  # what a native upstream needs for the edits
    ex = open_exchange(
        request,
        config,
        key,
        chat,
        session,
        ClientRequest(
            route=MESSAGES_ROUTE,
            wire="anthropic",
            renderer=view,
            native=view,
            stream=body.get("stream") is True,
            wants_usage=True,
            body_bytes=len(raw),
            forward_headers=headers,
            context=context,
        ),
    )
    if repair is not None:
        _repair_thinking(request, ex, view, repair)
    if not counting:
        memory.keep(owner, session.name, view.memory(), len(raw) + view.restored_bytes())
    return ex


def _repair_thinking(
    request: web.Request, ex: Exchange, view: AnthropicView, repair: ThinkingRepair
) -> None:
    """Thinking the client dropped put back (or, with none to put back where a tool loop needs
    it, thinking off for this request): a repair, recorded as one (applied unless dry-run)."""
    deployments = ex.config.deployments.get(ex.alias, ())
    if not ex.policy.repair.enabled or not any(view.native_for(d) for d in deployments):
        return  # a translated request carries no thinking: nothing to put back or turn off
    recorder = request.app[FLOW].recorder
    if repair.fresh:
        recorder.record(
            ex,
            "repair",
            "restored_thinking",
            count=repair.fresh,
            tool_call_ids=repair.new_calls,
            carried=repair.carried,
        )
    if repair.thinking_off is not None:
        recorder.record(ex, "repair", "disabled_thinking", message=repair.thinking_off)
    if not ex.dry_run:
        view.repair_thinking(repair)


class AnthropicWire:
    """Anthropic answers: a message, its event stream, errors in Anthropic's envelope."""

    def __init__(self, ex: Exchange, memory: TurnMemory) -> None:
        view = ex.client.native
        assert isinstance(view, AnthropicView)
        self.view = view
        self.memory = memory
        self.replies = anthropic.Replies(view)

    async def complete(self, ex: Exchange, flow: Flow) -> web.Response:
        reply = await flow.complete(ex, self.replies)
        if "choices" not in reply.data:  # the provider's own message, as it came
            self._provider_edits(ex, flow, reply.data.get("context_management"))
            if isinstance(content := reply.data.get("content"), list):
                remember(self.memory, ex.identity.owner, self.view.memory_session, content)
            return json_answer(ex, reply.body, reply.headers)
        message = self._translated(ex, flow, reply)
        return json_answer(ex, orjson.dumps(message), reply.headers)

    async def stream(self, request: web.Request, ex: Exchange, flow: Flow) -> web.StreamResponse:
        if ex.translated:  # the chat reply is asked for whole, then sent as this wire's events
            reply = await flow.complete(ex, self.replies)
            message = self._translated(ex, flow, reply)
            return events_answer(ex, message_stream(message), reply.headers)

        def relay(response: web.StreamResponse) -> Relay:
            edits = lambda data: self._provider_edits(ex, flow, data)  # noqa: E731
            return Relay(request, ex, response, self.view, edits)

        return await relay_stream(request, ex, flow, relay)

    def _translated(self, ex: Exchange, flow: Flow, reply: UpstreamReply) -> dict[str, Any]:
        """A translated answer, with the client's context edits the proxy carried out."""
        message = anthropic.client_message(reply, ex.alias, ex.identity.request_id)
        context = ex.client.context
        if context is None:
            return message
        thinking = cleared_thinking(context, self.view.body["messages"], self.view.cut or 0)
        if thinking is not None and thinking not in context.applied:
            context.applied.append(thinking)
            flow.recorder.record(
                ex, CONTEXT_STAGE, "cleared_thinking", turns=thinking.cleared,
                tokens=thinking.tokens,
            )  # fmt: skip
            flow.metrics.child(flow.metrics.context_edits, "clear_thinking", "client").inc()
        return answered(message, context)

    @staticmethod
    def _provider_edits(ex: Exchange, flow: Flow, data: Any) -> None:
        """A native answer's applied edits (passed on as they came): counted and noted."""
        edits = provider_edits(data)
        if not edits:
            return
        flow.recorder.record(ex, CONTEXT_STAGE, "provider_applied", edits=edits)
        for edit in edits:
            flow.metrics.child(flow.metrics.context_edits, edit, "provider").inc()

    def upstream_error(self, ex: Exchange, error: UpstreamHTTPError) -> web.Response:
        return upstream_error(ex, error, anthropic.passthrough_body(error, ex.identity.request_id))

    def degraded(self, ex: Exchange, error: Exception) -> web.Response:
        text = degraded_text(ex, error)
        message = anthropic.degraded_message(ex.alias, ex.identity.request_id, text)
        headers = {"x-agentproxy-degraded": "true"}
        if ex.client.stream:
            return events_answer(ex, message_stream(message), headers)
        return json_answer(ex, orjson.dumps(message), headers)
