"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.state import CONFIG, METRICS, UPSTREAMS

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
    return web.json_response({"status": "ready", "config_version": config.version})


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
