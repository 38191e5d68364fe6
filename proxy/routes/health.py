"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.state import CONFIG, METRICS, STORE_HEALTH, UPSTREAMS

routes = web.RouteTableDef()


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
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
