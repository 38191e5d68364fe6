"""The simulator behind a server that serves only some of its routes, as a real deployment
does: an OpenAI-compatible server with only /v1/responses (Codex-style), one with only
/v1/messages. Any other path gets FastAPI's 404, `{"detail":"Not Found"}`, recorded in
`refused`.

    app = serving_only(sim, "/v1/responses")
"""

from __future__ import annotations

from aiohttp import web

from proxy.sim.simulator import Simulator

NOT_FOUND = {"detail": "Not Found"}
REFUSED = web.AppKey("refused", list[str])


def serving_only(sim: Simulator, *paths: str) -> web.Application:
    app = sim.app()
    refused: list[str] = []
    app[REFUSED] = refused

    @web.middleware
    async def only(request: web.Request, handler: web.RequestHandler) -> web.StreamResponse:
        if request.path not in paths and not request.path.startswith("/sim/"):
            refused.append(request.path)
            return web.json_response(NOT_FOUND, status=404)
        return await handler(request)

    app.middlewares.append(only)
    return app
