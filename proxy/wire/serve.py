"""What every model route does around its own wire format: open the Exchange (model, key
rights, policy, session), hand it to the flow, render the outcome, and always settle and
charge. A route supplies only how its format is parsed and rendered (a `Wire`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

from proxy import eager, tracing
from proxy.errors import BadRequest, Forbidden, ModelNotFound, ProxyError
from proxy.exchange import Exchange
from proxy.flow import Flow, status_of
from proxy.http.middleware import CLIENT_GONE, EXCHANGE, MODEL_LABEL, OUTCOME_STATUS, REQUEST_ID
from proxy.policies.spec import ApiKey, Config, Policy
from proxy.sessions.identity import SessionName, owner_of, parent_session_id, scoped
from proxy.state import FLOW
from proxy.upstream.base import UpstreamHTTPError
from proxy.wire.relay import StreamRelay

POLICY_HEADER = "x-agentproxy-policy"


class Wire(Protocol):
    """How one wire format answers: a reply, a stream, a provider's error, a degraded answer."""

    async def complete(self, ex: Exchange, flow: Flow) -> web.Response: ...

    async def stream(
        self, request: web.Request, ex: Exchange, flow: Flow
    ) -> web.StreamResponse: ...

    def upstream_error(self, ex: Exchange, error: UpstreamHTTPError) -> web.Response: ...

    def degraded(self, ex: Exchange, error: Exception) -> web.Response: ...


def serve(request: web.Request, ex: Exchange, wire: Wire) -> Awaitable[web.StreamResponse]:
    flow = request.app[FLOW]
    if flow.tracing is None:  # no coroutine more than untraced serving needs
        return _serve(request, ex, wire, flow)
    return _traced(request, ex, wire, flow, flow.tracing)


async def _traced(
    request: web.Request, ex: Exchange, wire: Wire, flow: Flow, tracer: tracing.Tracing
) -> web.StreamResponse:
    with tracer.request(ex, request.headers) as span:
        response = await _serve(request, ex, wire, flow)
        tracing.responded(span, request.get(OUTCOME_STATUS, response.status))
        return response


async def _serve(request: web.Request, ex: Exchange, wire: Wire, flow: Flow) -> web.StreamResponse:
    try:  # guards (session circuit, loops, budgets) may refuse: say so with our headers
        await flow.admit(ex)
    except ProxyError as error:
        error.headers.update(proxy_headers(ex))
        raise
    ok = False
    try:
        if ex.stream:
            response: web.StreamResponse = await wire.stream(request, ex, flow)
        else:
            response = await wire.complete(ex, flow)
        ok = True
        return response
    except UpstreamHTTPError as error:  # what control gave up on: counted there
        if flow.degrades(ex, error):
            return wire.degraded(ex, error)
        return wire.upstream_error(ex, error)
    except ProxyError as error:
        flow.count_failure(ex, error)
        if flow.degrades(ex, error):
            return wire.degraded(ex, error)
        error.headers.update(proxy_headers(ex))
        raise
    finally:
        if ex.failure is not None:  # a stream that began, then failed: the request failed
            request[OUTCOME_STATUS] = status_of(ex.failure)
        # A client that leaves cancels this handler, maybe in the middle of charging it: the
        # charging runs to its end regardless (what was used is always charged). Against
        # in-process state it never waits: run at once, no task (proxy/eager.py).
        finishing = flow.finish(ex, ok)
        rest = eager.start(finishing) if flow.settles_inline else finishing
        if rest is not None:
            await asyncio.shield(rest)


async def relay_stream(
    request: web.Request,
    ex: Exchange,
    flow: Flow,
    relay_for: Callable[[web.StreamResponse], StreamRelay],
) -> web.StreamResponse:
    """A streamed answer: the first round opened (its headers go out with ours), then relayed
    by the wire's relay, recall rounds and all."""
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
    relay = relay_for(response)
    try:
        await flow.relay(ex, source, relay)
        await relay.end()
    except ConnectionResetError:
        request[CLIENT_GONE] = True
    return response


def json_answer(ex: Exchange, body: bytes, headers: Mapping[str, str]) -> web.Response:
    """A whole answer, with the upstream's headers worth passing on and ours."""
    return web.Response(
        body=body,
        content_type="application/json",
        headers={**headers, **proxy_headers(ex), "server-timing": ex.server_timing()},
    )


def events_answer(ex: Exchange, events: bytes, headers: Mapping[str, str]) -> web.Response:
    """A whole answer sent as its wire's event stream (a translated reply, asked for whole)."""
    answer = json_answer(ex, events, headers)
    answer.content_type = "text/event-stream"
    return answer


def upstream_error(ex: Exchange, error: UpstreamHTTPError, body: bytes) -> web.Response:
    """A provider's error as the client gets it (its body in the client's format)."""
    return web.Response(
        status=error.status,
        body=body,
        content_type="application/json",
        headers={**error.headers, **proxy_headers(ex)},
    )


def open_exchange(
    request: web.Request,
    config: Config,
    key: ApiKey | None,
    body: dict[str, Any],
    session: SessionName,
    **fields: Any,
) -> Exchange:
    """The Exchange of a parsed request whose session the route identified."""
    alias = body.get("model")
    if isinstance(alias, str) and alias not in config.deployments and config.catch_all:
        alias = config.catch_all  # one model served under any name (`serve --model`)
    if not isinstance(alias, str) or alias not in config.deployments:
        raise ModelNotFound(
            f"model '{alias}' is not configured here; GET /v1/models lists the models "
            "this proxy serves",
            param="model",
        )
    if key is not None and key.models is not None and alias not in key.models:
        raise Forbidden(f"API key '{key.name}' may not use model '{alias}'", param="model")
    request[MODEL_LABEL] = alias
    owner = owner_of(key, config.keys)
    parent = parent_session_id(request.headers)
    ex = request[EXCHANGE] = Exchange(
        request_id=request[REQUEST_ID],
        config=config,
        key=key,
        body=body,
        alias=alias,
        policy=_select_policy(request.headers, config, alias, key),
        session=scoped(owner, session.name),
        session_name=session.name,
        session_given=session.given,
        owner=owner,
        parent_session=scoped(owner, parent) if parent else None,
        **fields,
    )
    return ex


def _select_policy(
    headers: Mapping[str, str], config: Config, alias: str, key: ApiKey | None
) -> Policy:
    named = headers.get(POLICY_HEADER)
    if named:
        policy = config.policy_named(named)
        if policy is None:
            raise BadRequest(
                f"policy '{named}' named by the {POLICY_HEADER} header is not configured",
                code="policy_not_found",
            )
        return policy
    # request.headers looks names up case-insensitively, as policies' header matches expect.
    return config.select_policy(alias, key.name if key else None, headers)


def proxy_headers(ex: Exchange) -> dict[str, str]:
    headers = {
        "x-agentproxy-model": ex.alias,
        "x-agentproxy-policy": ex.policy.name,
        "x-agentproxy-session": ex.session_name,
    }
    if ex.prompt is not None:  # the prompt size its decisions took: counted, calibrated
        headers["x-agentproxy-prompt-tokens"] = str(ex.prompt.estimate)
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
