"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.runtime.identity import CHALLENGE_HEADER, answer_challenge
from proxy.state import CONFIG, IDENTITY, METRICS, STORE_HEALTH, UPSTREAMS

routes = web.RouteTableDef()


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    """Alive; with `x-agentproxy-challenge`, the proof that this user's `serve` runs here
    (proxy/runtime/identity.py), over the port the request arrived on."""
    nonce = request.headers.get(CHALLENGE_HEADER)
    if nonce is not None and request.transport is not None:
        port = request.transport.get_extra_info("sockname")[1]
        if proven := answer_challenge(request.app.get(IDENTITY), port, nonce):
            return web.json_response({"status": "ok", "proof": proven})
    return web.json_response({"status": "ok"})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    config = request.app[CONFIG].current
    if not request.app[UPSTREAMS].ready(config):
        return web.json_response(
            {"status": "starting", "waiting_for": "litellm import"}, status=503
        )
    store = await request.app[STORE_HEALTH].status()
    if store.problem is not None:  # offloads and archives would fail: overflows would follow
        return web.json_response(
            {"status": "store_unavailable", "store": store.describe()}, status=503
        )
    return web.json_response(
        {"status": "ready", "config_version": config.version, "store": store.describe()}
    )


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
