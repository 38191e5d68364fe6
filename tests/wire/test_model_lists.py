"""GET /v1/models and /v1beta/models: one shared dispatcher (proxy/wire/models.py) picks, per
request, the list of the wire whose manner the request is in (Google's key header or `?key=`),
else the list of the wire that claims no manner (OpenAI's); each lists only the models the
caller's key may use, and a refusal comes in the envelope of the path's first list."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.metrics import Metrics
from proxy.policies.loader import load_config
from proxy.policies.spec import Config
from proxy.policies.watch import ConfigHolder
from proxy.state import CONFIG
from proxy.wire.base import ModelList, WireFormat
from proxy.wire.chat.answer import ChatAnswer
from proxy.wire.chat.conversation import ChatConversation
from proxy.wire.models import model_list_routes
from proxy.wire.registry import WIRES
from tests.conftest import ProxyFactory

KEY = "sk-proxy-lists-1"
NARROW = "sk-proxy-lists-2"  # may use `second` only


def _config(tmp_path: Path, sim_url: str) -> Path:
    models = "".join(
        f"""
          - model_name: {alias}
            litellm_params: {{model: openai/{alias}, api_base: {sim_url}/v1}}"""
        for alias in ("first", "second")
    )
    text = f"""\
        store: {{path: {tmp_path / "state"}}}
        keys:
          api_keys:
            - {{name: wide, key: {KEY}}}
            - {{name: narrow, key: {NARROW}, models: [second]}}
        model_list:{models}
        """
    path = tmp_path / "lists.yaml"
    path.write_text(textwrap.dedent(text))
    return path


async def _get(
    proxy: TestServer, path: str, headers: dict[str, str], query: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        url = proxy.make_url(path).with_query(query or {})
        async with http.get(url, headers=headers) as response:
            return response.status, await response.json()


def _google(body: dict[str, Any]) -> list[str]:
    return [model["name"] for model in body["models"]]


def _openai(body: dict[str, Any]) -> list[str]:
    assert body["object"] == "list"
    return [model["id"] for model in body["data"]]


async def test_each_request_gets_the_list_of_its_manner(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start_proxy(_config(tmp_path, str(sim_server.make_url("")).rstrip("/")))
    bearer = {"Authorization": f"Bearer {KEY}"}
    status, body = await _get(proxy, "/v1/models", bearer)
    assert status == 200 and _openai(body) == ["first", "second"]
    status, body = await _get(proxy, "/v1/models", {"x-goog-api-key": KEY})
    assert status == 200 and _google(body) == ["models/first", "models/second"]
    status, body = await _get(proxy, "/v1/models", {}, {"key": NARROW})
    assert status == 200 and _google(body) == ["models/second"]
    status, body = await _get(proxy, "/v1/models", {"x-api-key": NARROW})  # no list of its own
    assert status == 200 and _openai(body) == ["second"]
    # Only Google's list is served under /v1beta/: whatever the manner, Google's.
    status, body = await _get(proxy, "/v1beta/models", bearer)
    assert status == 200 and _google(body) == ["models/first", "models/second"]
    # Refused in the envelope of the path's first list: OpenAI's, Google's.
    status, body = await _get(proxy, "/v1/models", {"Authorization": "Bearer wrong"})
    assert status == 401 and body["error"]["type"] == "authentication_error"
    status, body = await _get(proxy, "/v1beta/models", {"x-goog-api-key": "wrong"})
    assert status == 401 and body["error"]["status"] == "UNAUTHENTICATED"


def _own_wire() -> WireFormat:
    def render(config: Config, aliases: list[str]) -> dict[str, Any]:
        return {"own": aliases}

    return WireFormat(
        name="own",
        routes=web.RouteTableDef(),
        model_route=None,
        provider="own",
        assembly=ChatAnswer,
        conversation=ChatConversation(),
        model_list=ModelList(
            ("/v1/models", "/own/models"),
            render,
            in_manner=lambda request: "x-own" in request.headers,
        ),
    )


async def test_a_new_wire_shares_a_list_path_through_its_manner(
    aiohttp_server: Any, tmp_path: Path, sim_server: TestServer
) -> None:
    """A wire added to the registry lists at a shared path by its manner alone: no other
    wire's module knows of it."""
    config = load_config(_config(tmp_path, str(sim_server.make_url("")).rstrip("/")))
    app = web.Application()
    app[CONFIG] = ConfigHolder(None, config, Metrics())
    app.add_routes(model_list_routes((*WIRES, _own_wire())))
    server: TestServer = await aiohttp_server(app)
    own = {"Authorization": f"Bearer {NARROW}", "x-own": "1"}
    assert await _get(server, "/v1/models", own) == (200, {"own": ["second"]})
    assert await _get(server, "/own/models", {"Authorization": f"Bearer {KEY}"}) == (
        200,
        {"own": ["first", "second"]},
    )
    status, body = await _get(server, "/v1/models", {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and _openai(body) == ["first", "second"]
