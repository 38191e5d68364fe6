"""OpenAI surface: POST /v1/chat/completions (JSON and SSE) and GET /v1/models."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import orjson
from aiohttp import web

from proxy.auth import authenticate
from proxy.errors import BadRequest, Forbidden, ModelNotFound, ProxyError, UpstreamBadResponse
from proxy.exchange import Exchange, Usage
from proxy.middleware import CLIENT_GONE, MODEL_LABEL, REQUEST_ID
from proxy.policies.spec import ApiKey, Config, Policy
from proxy.routes.chat_request import parse_chat_request, read_body
from proxy.state import CATALOG, CONFIG, METRICS, UPSTREAMS
from proxy.upstream.base import UpstreamHTTPError, UpstreamStream

routes = web.RouteTableDef()

POLICY_HEADER = "x-agentproxy-policy"


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    config = request.app[CONFIG].current
    key = authenticate(request, config.keys)
    body = parse_chat_request(await read_body(request, config.server.max_body_bytes))
    ex = _open_exchange(request, config, key, body)
    upstreams = request.app[UPSTREAMS]
    ex.deployment = upstreams.pick(config.deployments[ex.alias])
    try:
        if ex.stream:
            return await _stream(request, ex)
        return await _complete(request, ex)
    except UpstreamHTTPError as error:
        request.app[METRICS].upstream_errors.labels(ex.alias, f"http_{error.status}").inc()
        return _passthrough_error(error, _headers(ex))
    except ProxyError as error:
        request.app[METRICS].upstream_errors.labels(ex.alias, error.code or error.type).inc()
        error.headers.update(_headers(ex))
        raise
    finally:
        _account(request, ex)


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
    ex = Exchange(
        request_id=request[REQUEST_ID],
        config=config,
        key=key,
        body=body,
        alias=alias,
        policy=_select_policy(request, config, alias, key),
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
    return {"x-agentproxy-model": ex.alias, "x-agentproxy-policy": ex.policy.name}


async def _complete(request: web.Request, ex: Exchange) -> web.Response:
    assert ex.deployment is not None
    upstream = request.app[UPSTREAMS].for_deployment(ex.deployment)
    waited = time.perf_counter()
    try:
        reply = await upstream.complete(ex.deployment, ex.body, ex.request_id)
    finally:
        ex.upstream_wait += time.perf_counter() - waited
    ex.usage = Usage.from_openai(reply.data.get("usage"))
    headers = {**reply.headers, **_headers(ex), "server-timing": _server_timing(ex)}
    return web.Response(body=reply.body, content_type="application/json", headers=headers)


async def _stream(request: web.Request, ex: Exchange) -> web.StreamResponse:
    assert ex.deployment is not None
    upstream = request.app[UPSTREAMS].for_deployment(ex.deployment)
    waited = time.perf_counter()
    try:
        source = await upstream.open_stream(ex.deployment, ex.body, ex.request_id)
    finally:
        ex.upstream_wait += time.perf_counter() - waited
    response = web.StreamResponse(
        headers={
            **source.headers,
            **_headers(ex),
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "x-request-id": ex.request_id,
        }
    )
    try:
        await _relay(request, ex, source, response)
    except ProxyError as error:
        if not response.prepared:
            raise
        await _write_error_event(ex, response, error)
    except ConnectionResetError:
        request[CLIENT_GONE] = True
        return response
    finally:
        await source.close()
    try:
        await response.write_eof()
    except ConnectionResetError:
        request[CLIENT_GONE] = True
    return response


async def _relay(
    request: web.Request, ex: Exchange, source: UpstreamStream, response: web.StreamResponse
) -> None:
    """Forward events as they complete, one write per upstream read; capture usage; hide the
    usage chunk we asked for."""
    done = False
    batches = source.events()
    while True:
        waited = time.perf_counter()
        try:
            batch = await anext(batches)
        except StopAsyncIteration:
            break
        finally:
            ex.upstream_wait += time.perf_counter() - waited
        out = bytearray()
        for event in batch:
            if event.startswith(b"data:"):
                payload = event[5:].strip()
                if payload == b"[DONE]":
                    done = True
                elif not _inspect_chunk(ex, payload):
                    continue
            out += event + b"\n\n"
        if not out:
            continue
        if not response.prepared:
            response.headers["server-timing"] = _server_timing(ex)
            await response.prepare(request)
        waited = time.perf_counter()
        await response.write(bytes(out))
        ex.client_wait += time.perf_counter() - waited
    if not done:
        raise UpstreamBadResponse(
            f"the upstream for '{ex.alias}' ended the stream before 'data: [DONE]'"
        )


def _inspect_chunk(ex: Exchange, payload: bytes) -> bool:
    """Whether to forward this chunk. A cheap shape check on every chunk (garbage ends the
    stream with a clear error); a full parse only for the one that carries usage."""
    if not (payload.startswith(b"{") and payload.endswith(b"}")):
        raise UpstreamBadResponse(
            f"the upstream for '{ex.alias}' sent a stream event that is not a JSON object: "
            f"{payload[:60]!r}"
        )
    if b'"usage"' not in payload or b'"usage":null' in payload:
        return True
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise UpstreamBadResponse(
            f"the upstream for '{ex.alias}' sent a stream event that is not JSON: {payload[:60]!r}"
        ) from None
    usage = chunk.get("usage")
    if usage:
        ex.usage = Usage.from_openai(usage)
        if not ex.client_wants_usage and not chunk.get("choices"):
            return False
    return True


async def _write_error_event(ex: Exchange, response: web.StreamResponse, error: ProxyError) -> None:
    """Bytes already reached the client: end the stream with an error event it can read."""
    ex.note("stream", "error", message=error.message)
    with contextlib.suppress(ConnectionResetError):
        await response.write(b"data: " + orjson.dumps(error.body(ex.request_id)) + b"\n\n")


def _passthrough_error(error: UpstreamHTTPError, headers: dict[str, str]) -> web.Response:
    """Provider errors pass through unchanged when they are JSON; anything else is wrapped."""
    body = error.body
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body[:500].decode("utf-8", "replace").strip() or "(empty body)"
        body = orjson.dumps(
            {
                "error": {
                    "message": f"upstream answered HTTP {error.status}: {text}",
                    "type": "upstream_error",
                    "param": None,
                    "code": "upstream_http_error",
                }
            }
        )
    return web.Response(
        status=error.status,
        body=body,
        content_type="application/json",
        headers={**error.headers, **headers},
    )


def _server_timing(ex: Exchange) -> str:
    return f"proxy;dur={ex.overhead() * 1000:.3f}, upstream;dur={ex.upstream_wait * 1000:.3f}"


def _account(request: web.Request, ex: Exchange) -> None:
    metrics = request.app[METRICS]
    metrics.child(metrics.overhead, "chat").observe(ex.overhead())
    metrics.child(metrics.upstream_duration, ex.alias).observe(ex.upstream_wait)
    if ex.usage is not None:
        metrics.child(metrics.tokens, ex.alias, "prompt").inc(ex.usage.prompt_tokens)
        metrics.child(metrics.tokens, ex.alias, "completion").inc(ex.usage.completion_tokens)
        cost = request.app[CATALOG].cost(ex.deployment, ex.usage) if ex.deployment else None
        if cost:
            metrics.child(metrics.cost, ex.alias).inc(cost)


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
