"""What every model route shares: reading its request (key, body), opening the Exchange (model,
key rights, policy, session), handing it to the flow (proxy/flow.py: Flow.serve) and the answer
shapes its `Answers` build (a JSON answer, a relayed stream, a provider's error)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from proxy.errors import BadRequest, Forbidden, ModelNotFound
from proxy.exchange import ClientRequest, Exchange, Identity
from proxy.flow import Answers, Flow
from proxy.guards.secrets.restore import UNRESTORED, restore_bytes
from proxy.http.auth import authenticate, presented_key
from proxy.http.headers import proxy_headers
from proxy.http.keys import RAW_BODY
from proxy.http.middleware import CLIENT_GONE, EXCHANGE, MODEL_LABEL, REQUEST_ID
from proxy.policies.spec import ApiKey, Config, Policy
from proxy.sessions.identity import (
    SessionName,
    key_free,
    owner_of,
    parent_session_id,
    scoped,
)
from proxy.state import CONFIG, FLOW
from proxy.upstream.base import UpstreamHTTPError
from proxy.wire.body import read_body
from proxy.wire.relay import StreamRelay

POLICY_HEADER = "x-agentproxy-policy"


async def read_request(request: web.Request) -> tuple[Config, ApiKey | None, bytes]:
    """What every model route opens with: the config snapshot the request runs under, the
    caller's key (refused here if it is not one), and the body's bytes (capped, timed)."""
    config = request.app[CONFIG].current
    key = authenticate(request, config.keys)
    raw = await read_body(request, config.server.max_body_bytes, config.server.body_timeout_s)
    request[RAW_BODY] = raw  # a reference: read again only if the session is recorded
    return config, key, raw


def serve(request: web.Request, ex: Exchange, answers: Answers) -> Awaitable[web.StreamResponse]:
    """Hand the opened Exchange to the flow, which owns it from here to its charge."""
    return request.app[FLOW].serve(request, ex, answers)


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
            "x-request-id": ex.identity.request_id,
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
    """A whole answer, with the upstream's headers worth passing on and ours; the secrets
    its placeholders stand for given back (the recording keeps it as it came)."""
    answer = body if ex.secrets is None else restore_bytes(body, ex.secrets)
    response = web.Response(
        body=answer,
        content_type="application/json",
        headers={**headers, **proxy_headers(ex), "server-timing": ex.server_timing()},
    )
    if answer is not body:
        response[UNRESTORED] = body
    return response


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
    client: ClientRequest,
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
    presented = presented_key(request)
    name = key_free(session.name, presented, config) if session.given else session.name
    parent = parent_session_id(request.headers)
    if parent is not None:
        parent = key_free(parent, presented, config)
    ex = request[EXCHANGE] = Exchange(
        identity=Identity(
            request_id=request[REQUEST_ID],
            key=key,
            owner=owner,
            session=scoped(owner, name),
            session_name=name,
            session_given=session.given,
            parent_session=scoped(owner, parent) if parent else None,
        ),
        config=config,
        body=body,
        alias=alias,
        policy=_select_policy(request.headers, config, alias, key),
        client=client,
    )
    if ex.policy.record.enabled:  # chat: its body is the client's; else its view's is
        native = client.native
        ex.received = dict(body) if native is None else getattr(native, "body", None)
    return ex


def _select_policy(
    headers: Mapping[str, str], config: Config, alias: str, key: ApiKey | None
) -> Policy:
    named = headers.get(POLICY_HEADER)
    if named:
        policy = config.policy_named(named, key.name if key else None)
        if policy is None:
            raise BadRequest(
                f"policy '{named}' named by the {POLICY_HEADER} header is not configured",
                code="policy_not_found",
            )
        return policy
    # request.headers looks names up case-insensitively, as policies' header matches expect.
    return config.select_policy(alias, key.name if key else None, headers)
