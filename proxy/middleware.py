"""The one middleware: request id in, OpenAI-style errors out, every request counted and logged."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.errors import InternalError, ProxyError, error_response, from_http_exception
from proxy.state import CONFIG, METRICS

log = logging.getLogger("agentproxy")
access_log = logging.getLogger("agentproxy.access")

REQUEST_ID = web.RequestKey("request_id", str)
# Set by handlers once the model alias is known to be configured (bounded metric labels).
MODEL_LABEL = web.RequestKey("model_label", str)
# Set by handlers when the client hung up mid-response; counted as status 499.
CLIENT_GONE = web.RequestKey("client_gone", bool)
STATUS_CLIENT_GONE = 499


def _request_id(request: web.Request) -> str:
    given = request.headers.get("x-request-id", "")
    if 0 < len(given) <= 128 and given.isprintable():
        return given
    return secrets.token_hex(12)


@web.middleware
async def proxy_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    request_id = request[REQUEST_ID] = _request_id(request)
    in_flight = request.app[METRICS].in_flight
    in_flight.inc()  # a scrape counts itself: the gauge reads 1 when idle
    response: web.StreamResponse
    try:
        response = await handler(request)
    except asyncio.CancelledError:
        # The client went away and the server cancelled the handler (handler_cancellation).
        _account(request, STATUS_CLIENT_GONE, started)
        raise
    except ProxyError as error:
        response = error_response(error, request_id)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = error_response(from_http_exception(exc), request_id)
    except Exception:
        log.exception("request %s failed inside the proxy", request_id)
        response = error_response(
            InternalError(f"the proxy failed to handle this request (request id {request_id})"),
            request_id,
        )
    finally:
        in_flight.dec()
    if not response.prepared:
        response.headers["x-request-id"] = request_id
    _account(request, STATUS_CLIENT_GONE if request.get(CLIENT_GONE) else response.status, started)
    return response


def _account(request: web.Request, status: int, started: float) -> None:
    elapsed = time.perf_counter() - started
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    model = request.get(MODEL_LABEL, "-")
    metrics = request.app[METRICS]
    metrics.child(metrics.requests, route, model, str(status)).inc()
    metrics.child(metrics.request_duration, route, model).observe(elapsed)
    # Failures are always logged with their request id; successes when access_log is on.
    if (status >= 400 or request.app[CONFIG].current.server.access_log) and (
        access_log.isEnabledFor(logging.INFO)
    ):
        access_log.info(
            "%s %s %s %d model=%s %.1fms",
            request[REQUEST_ID],
            request.method,
            request.path,
            status,
            model,
            elapsed * 1000,
        )
