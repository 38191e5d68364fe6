"""The one middleware: request id in, OpenAI-style errors out, every request counted and logged;
no request another site's page sent (its Origin) reaches a handler."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.errors import (
    InternalError,
    Overloaded,
    ProxyError,
    error_response,
    from_http_exception,
)
from proxy.http.auth import check_origin
from proxy.http.body_budget import BODY_BUDGET
from proxy.http.keys import (
    CLIENT_GONE as CLIENT_GONE,
)
from proxy.http.keys import ERROR_BODY
from proxy.http.keys import (
    EXCHANGE as EXCHANGE,
)
from proxy.http.keys import (
    MODEL_LABEL as MODEL_LABEL,
)
from proxy.http.keys import (
    OUTCOME_STATUS as OUTCOME_STATUS,
)
from proxy.http.keys import (
    REQUEST_ID as REQUEST_ID,
)
from proxy.http.keys import (
    STATUS_CLIENT_GONE as STATUS_CLIENT_GONE,
)
from proxy.request_id import new_request_id
from proxy.state import CONFIG, METRICS

log = logging.getLogger("agentproxy")
access_log = logging.getLogger("agentproxy.access")

# Cheap and answering even when the proxy is saturated: monitoring must see it, not time out.
UNCAPPED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
RETRY_AFTER_S = 1


class Handling:
    """How many requests are being handled now, against server.max_in_flight: each one holds
    its body, so the cap bounds memory; past it a client is told to come back shortly. And,
    for the drain (proxy/runtime/server.py), when the last request began and whether the server is
    draining: then every answer closes its connection."""

    __slots__ = ("count", "draining", "last_started", "memory_full")

    def __init__(self) -> None:
        self.count = 0
        self.last_started = 0.0  # time.perf_counter()
        self.draining = False
        # A worker that left for a fresh one is past its hard memory ceiling (recycle.py).
        self.memory_full = False

    def enter(self, limit: int) -> None:
        if self.memory_full:
            raise Overloaded(
                "this proxy worker is past its memory ceiling (server.max_rss_mb) and hands "
                "over to a fresh one; retry on a new connection",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        if self.count >= limit:
            raise Overloaded(
                f"the proxy is handling {self.count} requests, its limit "
                f"(server.max_in_flight); retry shortly",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self.count += 1

    def leave(self) -> None:
        self.count -= 1


HANDLING = web.AppKey("handling", Handling)


def _request_id(request: web.Request) -> str:
    """The client's own id (echoed and logged; sent upstream only if UUID-shaped), else a
    new UUID."""
    given = request.headers.get("x-request-id", "")
    if 0 < len(given) <= 128 and given.isprintable():
        return given
    return new_request_id()


@web.middleware
async def proxy_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    request_id = request[REQUEST_ID] = _request_id(request)
    in_flight = request.app[METRICS].in_flight
    in_flight.inc()  # a scrape counts itself: the gauge reads 1 when idle
    handling = request.app[HANDLING]
    handling.last_started = started
    capped = request.path not in UNCAPPED_PATHS
    response: web.StreamResponse
    try:
        check_origin(request)  # before any handler: another site's page gets nothing
        if capped:
            handling.enter(request.app[CONFIG].current.server.max_in_flight)
        try:
            response = await handler(request)
        finally:
            if capped:
                handling.leave()
    except asyncio.CancelledError:
        # The client went away and the server cancelled the handler (handler_cancellation).
        _account(request, STATUS_CLIENT_GONE, started)
        raise
    except ProxyError as error:
        response = _error_response(request, error, request_id)
        if error.closes_connection:
            await _answer_and_hang_up(request, response, request_id)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        refused = from_http_exception(exc)
        if exc.status in (404, 405):  # say what is served here
            refused.message = f"{request.method} {request.path} is not served; {_served(request)}"
        response = _error_response(request, refused, request_id)
    except Exception as exc:
        if isinstance(exc, ConnectionError) and _client_gone(request):
            # Hung up while its body was read or its answer written: nothing to answer.
            request[CLIENT_GONE] = True
            response = web.Response(status=STATUS_CLIENT_GONE)
        else:
            log.exception("request %s failed inside the proxy", request_id)
            response = _error_response(
                request,
                InternalError(f"the proxy failed to handle this request (request id {request_id})"),
                request_id,
            )
    finally:
        in_flight.dec()
        request.app[BODY_BUDGET].release(request)  # the body it held, however it ended
    if not response.prepared:
        response.headers["x-request-id"] = request_id
        if _client_gone(request):  # the answer is ready but nobody is left to read it
            request[CLIENT_GONE] = True
    if request.get(CLIENT_GONE):
        status = STATUS_CLIENT_GONE
    else:
        status = request.get(OUTCOME_STATUS, response.status)
    _account(request, status, started)
    return response


def access_fields(
    request: web.Request, status: int, model: str, elapsed: float
) -> dict[str, object]:
    """One request as a JSON log line: who, what, what the proxy did, what it cost. Names and
    numbers only: never a key, a header value or a message of the conversation."""
    fields: dict[str, object] = {
        "request_id": request[REQUEST_ID],
        "method": request.method,
        "path": request.path,
        "status": status,
        "model": model,
        "duration_ms": round(elapsed * 1000, 3),
    }
    ex = request.get(EXCHANGE)
    if ex is None:
        return fields
    usage = ex.accounting.usage
    fields.update(
        session=ex.identity.session_name,
        key=ex.identity.key.name if ex.identity.key is not None else None,
        policy=ex.policy.name,
        wire=ex.client.wire,
        stream=ex.client.stream,
        deployment=ex.deployment.model if ex.deployment is not None else None,
        upstream_calls=ex.recovery.calls,
        recoveries=ex.recovery.recoveries(),
        rewrites=[f"{note.stage}.{note.action}" for note in ex.notes],
        prompt_tokens=usage.prompt_tokens if usage is not None else None,
        completion_tokens=usage.completion_tokens if usage is not None else None,
        cost_usd=ex.accounting.cost_usd,
        upstream_ms=round(ex.timing.upstream_wait * 1000, 3),
        proxy_ms=round(ex.overhead() * 1000, 3),
    )
    return fields


async def close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: while the server drains, an answer tells its client to take a new
    connection (`Connection: close`) and the connection closes after it, so a client never
    sends on a connection the server is about to close."""
    if request.app[HANDLING].draining:
        response.force_close()  # the connection closes after this answer
        # aiohttp wrote its Connection header before this hook: the client must be told.
        response.headers["Connection"] = "close"


async def _answer_and_hang_up(
    request: web.Request, response: web.StreamResponse, request_id: str
) -> None:
    """Send the answer now and close: aiohttp would otherwise wait 10 s more (lingering) for
    the rest of a body that stopped arriving."""
    response.headers["x-request-id"] = request_id
    response.force_close()
    with contextlib.suppress(ConnectionError):
        await response.prepare(request)
        await response.write_eof()
    request.protocol.force_close()


def _error_response(request: web.Request, error: ProxyError, request_id: str) -> web.Response:
    """An error in the wire format of the route the client called (its wire says which)."""
    frame = request.app.get(ERROR_BODY)
    if frame is None:  # an app without wires: OpenAI's envelope
        return error_response(error, request_id)
    resource = request.match_info.route.resource
    matched = resource.canonical if resource is not None else None
    return error_response(error, request_id, body=frame(matched, request.path, error, request_id))


def _served(request: web.Request) -> str:
    """The routes this app serves, for a client that called one it does not."""
    routes = sorted(
        {
            f"{route.method} {route.resource.canonical}"
            for route in request.app.router.routes()
            if route.resource is not None and route.method in ("GET", "POST")
        }
    )
    return "it serves: " + ", ".join(routes)


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _account(request: web.Request, status: int, started: float) -> None:
    elapsed = time.perf_counter() - started
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    model = request.get(MODEL_LABEL, "-")
    metrics = request.app[METRICS]
    metrics.child(metrics.requests, route, model, str(status)).inc()
    metrics.child(metrics.request_duration, route, model).observe(elapsed)
    # Failures are always logged with their request id; successes when access_log is on.
    server = request.app[CONFIG].current.server
    if not (status >= 400 or server.access_log) or not access_log.isEnabledFor(logging.INFO):
        return
    if server.log_format == "json":
        fields = access_fields(request, status, model, elapsed)
        access_log.info("%s %s %d", request.method, request.path, status, extra={"fields": fields})
    else:
        access_log.info(
            "%s %s %s %d model=%s %.1fms",
            request[REQUEST_ID],
            request.method,
            request.path,
            status,
            model,
            elapsed * 1000,
        )
