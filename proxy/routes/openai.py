"""OpenAI surface: POST /v1/chat/completions (JSON and SSE) and GET /v1/models."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from proxy.auth import authenticate
from proxy.dialects import chat, chat_degraded
from proxy.dialects.chat_stream import Relay
from proxy.errors import BadRequest, Forbidden, ModelNotFound, ProxyError
from proxy.exchange import Exchange
from proxy.flow import Flow, status_of
from proxy.middleware import CLIENT_GONE, MODEL_LABEL, OUTCOME_STATUS, REQUEST_ID
from proxy.policies.spec import ApiKey, Config, Policy
from proxy.routes.body import read_body
from proxy.routes.chat_request import parse_chat_request
from proxy.session import owner_of, parent_session_id, scoped, session_id
from proxy.state import CONFIG, FLOW
from proxy.upstream.base import UpstreamHTTPError

routes = web.RouteTableDef()
CHAT_ROUTE = "/v1/chat/completions"  # also the `route` label of its metrics

POLICY_HEADER = "x-agentproxy-policy"


@routes.post(CHAT_ROUTE)
async def chat_completions(request: web.Request) -> web.StreamResponse:
    config = request.app[CONFIG].current
    key = authenticate(request, config.keys)
    raw = await read_body(request, config.server.max_body_bytes, config.server.body_timeout_s)
    ex = _open_exchange(request, config, key, parse_chat_request(raw))
    ex.body_bytes = len(raw)
    flow = request.app[FLOW]
    try:  # guards (session circuit, loops, budgets) may refuse: say so with our headers
        await flow.admit(ex)
    except ProxyError as error:
        error.headers.update(_headers(ex))
        raise
    ok = False
    try:
        response = await (_stream(request, ex, flow) if ex.stream else _complete(ex, flow))
        ok = True
        return response
    except UpstreamHTTPError as error:  # what control gave up on: counted there
        if flow.degrades(ex, error):
            return chat_degraded.answer(ex, error, _headers(ex))
        return _passthrough_error(error, ex)
    except ProxyError as error:
        flow.count_failure(ex, error)
        if flow.degrades(ex, error):
            return chat_degraded.answer(ex, error, _headers(ex))
        error.headers.update(_headers(ex))
        raise
    finally:
        if ex.failure is not None:  # a stream that began, then failed: the request failed
            request[OUTCOME_STATUS] = status_of(ex.failure)
        # A client that leaves cancels this handler, maybe in the middle of charging it: the
        # charging runs to its end regardless (what was used is always charged).
        await asyncio.shield(flow.finish(ex, ok))


async def _complete(ex: Exchange, flow: Flow) -> web.Response:
    reply = await flow.complete(ex, chat)
    return web.Response(
        body=reply.body,
        content_type="application/json",
        headers={**reply.headers, **_headers(ex), "server-timing": ex.server_timing()},
    )


async def _stream(request: web.Request, ex: Exchange, flow: Flow) -> web.StreamResponse:
    source = await flow.open_stream(ex)
    response = web.StreamResponse(
        headers={
            **source.headers,
            **_headers(ex),
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "x-request-id": ex.request_id,
        }
    )
    relay = Relay(request, ex, response)
    try:
        await flow.relay(ex, source, relay)
        await relay.end()
    except ConnectionResetError:
        request[CLIENT_GONE] = True
    return response


def _open_exchange(
    request: web.Request, config: Config, key: ApiKey | None, body: dict[str, Any]
) -> Exchange:
    alias: str = body["model"]
    if alias not in config.deployments:
        raise ModelNotFound(
            f"model '{alias}' is not configured here; GET /v1/models lists the models "
            "this proxy serves",
            param="model",
        )
    if key is not None and key.models is not None and alias not in key.models:
        raise Forbidden(f"API key '{key.name}' may not use model '{alias}'", param="model")
    request[MODEL_LABEL] = alias
    stream = body.get("stream") is True
    options = body.get("stream_options") or {}
    owner = owner_of(key, config.keys)
    name = session_id(request.headers, body, key.name if key else None)
    parent = parent_session_id(request.headers)
    ex = Exchange(
        request_id=request[REQUEST_ID],
        config=config,
        key=key,
        body=body,
        alias=alias,
        policy=_select_policy(request, config, alias, key),
        session=scoped(owner, name),
        session_name=name,
        owner=owner,
        parent_session=scoped(owner, parent) if parent else None,
        stream=stream,
        client_wants_usage=bool(options.get("include_usage")),
    )
    if stream and not ex.client_wants_usage:
        # Ask for usage so every streamed call is accounted; that chunk is dropped on the way out.
        body["stream_options"] = {**options, "include_usage": True}
    return ex


def _select_policy(request: web.Request, config: Config, alias: str, key: ApiKey | None) -> Policy:
    named = request.headers.get(POLICY_HEADER)
    if named:
        policy = config.policy_named(named)
        if policy is None:
            raise BadRequest(
                f"policy '{named}' named by the {POLICY_HEADER} header is not configured",
                code="policy_not_found",
            )
        return policy
    # request.headers looks names up case-insensitively, as policies' header matches expect.
    return config.select_policy(alias, key.name if key else None, request.headers)


def _headers(ex: Exchange) -> dict[str, str]:
    headers = {
        "x-agentproxy-model": ex.alias,
        "x-agentproxy-policy": ex.policy.name,
        "x-agentproxy-session": ex.session_name,
    }
    if ex.notes:
        headers["x-agentproxy-applied"] = applied_header(ex)
    if ex.dry_run:
        headers["x-agentproxy-dry-run"] = "true"
    return headers


def applied_header(ex: Exchange) -> str:
    """What the proxy did, compactly: `stage.action;count=2;tokens=9000>1500, ...`."""
    parts = []
    for note in ex.notes:
        part = f"{note.stage}.{note.action}"
        if "count" in note.fields:
            part += f";count={note.fields['count']}"
        if "tokens_before" in note.fields and "tokens_after" in note.fields:
            part += f";tokens={note.fields['tokens_before']}>{note.fields['tokens_after']}"
        parts.append(part)
    return ", ".join(parts)


def _passthrough_error(error: UpstreamHTTPError, ex: Exchange) -> web.Response:
    """Provider errors pass through unchanged when they are JSON (anything else is wrapped),
    plus what recovery tried when it tried anything (chat.passthrough_body)."""
    return web.Response(
        status=error.status,
        body=chat.passthrough_body(error, ex.request_id),
        content_type="application/json",
        headers={**error.headers, **_headers(ex)},
    )


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    config = request.app[CONFIG].current
    key = authenticate(request, config.keys)
    aliases = [
        a for a in config.deployments if key is None or key.models is None or a in key.models
    ]
    data = [
        {"id": alias, "object": "model", "created": 0, "owned_by": "agentproxy"}
        for alias in aliases
    ]
    return web.json_response({"object": "list", "data": data}, dumps=_dumps)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()
