"""GET of the model lists: one route per path some wire lists the models at, shared by the
wires listing there (OpenAI's and Google's /v1/models). A request in one wire's manner (its
key header, say) gets that wire's list; any other, the list of the wire that claims no manner
of its own (with none, the first listed there). Each lists the aliases the caller's key may
use, in the configuration's order."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from proxy.http.auth import authenticate
from proxy.state import CONFIG
from proxy.wire.base import ModelList, Wire

Handler = Callable[[web.Request], Awaitable[web.Response]]


def model_list_routes(wires: tuple[Wire, ...]) -> web.RouteTableDef:
    """The GET routes of every wire's model list, one per path."""
    at: dict[str, list[ModelList]] = {}
    for wire in wires:
        if wire.model_list is not None:
            for path in wire.model_list.paths:
                at.setdefault(path, []).append(wire.model_list)
    routes = web.RouteTableDef()
    for path, lists in at.items():
        routes.get(path)(_handler(tuple(lists)))
    return routes


def _handler(lists: tuple[ModelList, ...]) -> Handler:
    mannered = tuple(listing for listing in lists if listing.in_manner is not None)
    # No list without a manner here (Google's /v1beta/models): the first answers every request.
    default = next((listing for listing in lists if listing.in_manner is None), lists[0])

    async def list_models(request: web.Request) -> web.Response:
        listing = next((m for m in mannered if m.in_manner and m.in_manner(request)), default)
        config = request.app[CONFIG].current
        key = authenticate(request, config.keys)
        aliases = [
            alias
            for alias in config.deployments
            if key is None or key.models is None or alias in key.models
        ]
        return web.json_response(listing.render(config, aliases), dumps=_dumps)

    return list_models


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()
