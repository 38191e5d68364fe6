"""Who the proxy trusts without a key, over real sockets: a loopback client naming the proxy
(never a page of another site whose name was pointed at 127.0.0.1, DNS rebinding, nor a request
sent by another origin's page), and only while the proxy has no keys at all: once it has API
keys, recorded content goes to the admin key or to the key that owns it."""

from __future__ import annotations

import logging
import textwrap
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.http.auth import KEY_PLACES, presented_key
from proxy.sim.simulator import Simulator
from proxy.state import CONFIG, RECORDINGS, STORE
from proxy.store.base import BlobInfo, content_ref
from proxy.wire.base import WireFormat, key_places
from proxy.wire.chat.answer import ChatAnswer
from proxy.wire.chat.conversation import ChatConversation
from proxy.wire.registry import WIRES
from tests.conftest import ProxyFactory, sim_config

ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}
KEYS = """
keys:
  api_keys:
    - {name: alice, key: sk-alice}
    - {name: bob, key: sk-bob}
"""
RECORDED = """
policies:
  - name: recorded
    record: {enabled: true}
"""
PROMPT = "the secret plan of this session"


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, extra: str = ""
) -> TestServer:
    path = tmp_path / "agentproxy.yaml"
    url = str(sim_server.make_url("")).rstrip("/")
    store = f"store: {{path: {tmp_path / 'data'}}}\n"
    path.write_text(sim_config(url, store + textwrap.dedent(extra) + textwrap.dedent(RECORDED)))
    return await start_proxy(path)


async def call(
    proxy: TestServer,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    **options: Any,
) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        url = str(proxy.make_url(path))
        async with http.request(method, url, headers=headers or {}, **options) as r:
            if r.content_type == "application/json":
                return r.status, await r.json()
            return r.status, await r.text()


async def ask(proxy: TestServer, headers: dict[str, str] | None = None) -> int:
    body = {"model": "sim", "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"x-agentproxy-session": "plan", **(headers or {})}
    status, _ = await call(proxy, "POST", "/v1/chat/completions", headers, json=body)
    return status


async def archived(proxy: TestServer, owner: str | None) -> str:
    data = b"an archived tool result"
    ref = content_ref(f"{owner}/s1", "tool_result", data)
    info = BlobInfo(ref, f"{owner}/s1", "tool_result", len(data), time.time() - 1, owner, {})
    await proxy.app[STORE].put(info, data)
    return ref


def port(proxy: TestServer) -> int:
    assert proxy.port is not None
    return proxy.port


async def reads(proxy: TestServer, headers: dict[str, str]) -> dict[str, int]:
    """Every route that serves loopback without a key on an open proxy: its status."""
    ref = await archived(proxy, None)
    _, listed = await call(proxy, "GET", "/admin/sessions")
    session = listed["data"][0]["id"]
    statuses = {}
    for method, path in [
        ("GET", "/admin/sessions"),
        ("GET", f"/admin/sessions/{session}?full=1"),
        ("GET", "/admin/policies"),
        ("GET", f"/v1/agentproxy/archive/{ref}"),
        ("GET", "/v1/agentproxy/sessions/s1/archive"),
        ("GET", "/ui"),
        ("GET", "/v1/models"),
    ]:
        statuses[path.partition("?")[0]], _ = await call(proxy, method, path, headers)
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
    statuses["/v1/chat/completions"], _ = await call(
        proxy, "POST", "/v1/chat/completions", headers, json=body
    )
    return statuses


# --- the Host a loopback client names -------------------------------------------------------


async def test_a_rebound_name_gets_nothing_an_open_proxy_serves_loopback(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, sim: Simulator
) -> None:
    """DNS rebinding: a page of evil.example, its name now pointing at 127.0.0.1, calls the
    proxy from the browser on this machine; its requests name evil.example in Host."""
    proxy = await start(start_proxy, tmp_path, sim_server)
    assert await ask(proxy) == 200
    calls = sim.request_count
    rebound = await reads(proxy, {"Host": f"evil.example:{port(proxy)}"})
    assert set(rebound.values()) == {403}, rebound
    assert sim.request_count == calls  # no model call was made for it
    status, body = await call(proxy, "GET", "/admin/sessions", {"Host": "evil.example"})
    assert status == 403 and body["error"]["code"] == "host_not_served"
    assert "evil.example" in body["error"]["message"]
    assert "server.allowed_hosts" in body["error"]["message"]
    assert PROMPT not in str(body)
    # In the route's own error shape: Anthropic's envelope on its route.
    anthropic = {"model": "sim", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    status, body = await call(
        proxy, "POST", "/v1/messages", {"Host": "evil.example"}, json=anthropic
    )
    assert status == 403 and body["type"] == "error"
    assert body["error"]["type"] == "permission_error"
    assert sim.request_count == calls


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "LOCALHOST.", "[::1]", "127.0.0.2", "agent.localhost"]
)
async def test_loopback_names_with_any_port_are_the_proxys_own(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, host: str
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server)
    assert await ask(proxy) == 200
    for named in (host, f"{host}:{port(proxy)}", f"{host}:8080"):
        statuses = await reads(proxy, {"Host": named})
        assert set(statuses.values()) == {200}, (named, statuses)


async def test_the_configured_host_and_allowed_hosts_are_served(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    extra = "server: {host: proxy.test, allowed_hosts: [Agents.Internal]}\n"
    proxy = await start(start_proxy, tmp_path, sim_server, extra)
    assert await ask(proxy) == 200
    for named in ("proxy.test", f"agents.internal:{port(proxy)}"):
        assert set((await reads(proxy, {"Host": named})).values()) == {200}, named
    assert (await call(proxy, "GET", "/admin/sessions", {"Host": "other.test"}))[0] == 403


async def test_a_wildcard_bind_address_names_nothing(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, "server: {host: 0.0.0.0}\n")
    assert (await call(proxy, "GET", "/admin/policies", {"Host": "0.0.0.0"}))[0] == 403
    assert (await call(proxy, "GET", "/admin/policies", {"Host": "localhost"}))[0] == 200


async def test_with_a_key_the_host_is_not_what_admits(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    """Behind a reverse proxy on the same machine every client is loopback and names the
    public host: the key admits it, as before."""
    proxy = await start(start_proxy, tmp_path, sim_server, KEYS)
    public = {"Host": "proxy.example.com", **ALICE}
    assert await ask(proxy, public) == 200
    assert (await call(proxy, "GET", "/admin/sessions", public))[0] == 200
    assert (await call(proxy, "GET", "/ui", {"Host": "proxy.example.com"}))[0] == 200


# --- the Origin a browser names ----------------------------------------------------------------


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://localhost:3000"])
async def test_a_request_sent_by_another_origins_page_is_refused(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, sim: Simulator, origin: str
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server)
    assert await ask(proxy) == 200
    calls = sim.request_count
    statuses = await reads(proxy, {"Origin": origin})
    assert set(statuses.values()) == {403}, statuses
    # The cross-origin "simple" POST a page can send without asking: nothing reloaded.
    status, body = await call(
        proxy, "POST", "/admin/reload", {"Origin": origin, "Content-Type": "text/plain"}, data="{}"
    )
    assert status == 403 and body["error"]["code"] == "foreign_origin"
    assert sim.request_count == calls
    assert proxy.app[CONFIG].last_reload is None


async def test_the_proxys_own_origin_is_served(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    """What a page of the proxy's own sends: its origin, the one the Host names."""
    proxy = await start(start_proxy, tmp_path, sim_server)
    assert await ask(proxy) == 200
    own = f"http://127.0.0.1:{port(proxy)}"
    assert set((await reads(proxy, {"Origin": own})).values()) == {200}
    status, _ = await call(proxy, "POST", "/admin/reload", {"Origin": own}, json={})
    assert status == 200


# --- state changes take JSON ------------------------------------------------------------------


async def test_reload_takes_a_json_content_type_only(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server)
    for headers in (
        {"Content-Type": "text/plain"},
        {},
        {"Content-Type": "application/x-www-form-urlencoded"},
    ):
        status, body = await call(proxy, "POST", "/admin/reload", headers, data="")
        assert status == 415, headers
        assert body["error"]["code"] == "unsupported_media_type"
        assert "application/json" in body["error"]["message"]
    assert proxy.app[CONFIG].last_reload is None
    status, body = await call(proxy, "POST", "/admin/reload", json={})
    assert status == 200 and body["ok"] is True
    headers = {"Content-Type": "application/json; charset=utf-8"}
    assert (await call(proxy, "POST", "/admin/reload", headers))[0] == 200


# --- keys configured, no admin key ----------------------------------------------------------------


async def test_with_api_keys_recorded_content_needs_the_owning_key(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    """No admin key: loopback without a key reads no tenant's sessions, timelines or archive;
    the owning key reads its own, another key nothing of it."""
    proxy = await start(start_proxy, tmp_path, sim_server, KEYS)
    assert await ask(proxy, ALICE) == 200
    await proxy.app[RECORDINGS].flush()
    ref = await archived(proxy, "key:alice")
    status, body = await call(proxy, "GET", "/admin/sessions")
    assert status == 401 and PROMPT not in str(body)
    _, alices = await call(proxy, "GET", "/admin/sessions", ALICE)
    session = alices["data"][0]["id"]
    status, body = await call(proxy, "GET", f"/admin/sessions/{session}?full=1")
    assert status == 401 and PROMPT not in str(body)
    status, body = await call(proxy, "GET", f"/admin/sessions/{session}?full=1", ALICE)
    assert status == 200 and PROMPT in str(body)
    assert (await call(proxy, "GET", f"/admin/sessions/{session}?full=1", BOB))[0] == 404
    assert (await call(proxy, "GET", "/admin/sessions", BOB))[1]["data"] == []
    assert (await call(proxy, "GET", f"/v1/agentproxy/archive/{ref}"))[0] == 401
    assert (await call(proxy, "GET", f"/v1/agentproxy/archive/{ref}", ALICE))[0] == 200
    assert (await call(proxy, "GET", f"/v1/agentproxy/archive/{ref}", BOB))[0] == 404
    # The page asks for a key before it reads anything.
    status, page = await call(proxy, "GET", "/ui")
    assert status == 200 and 'data-key="required"' in page
    # The admin routes that hold no recorded content still serve loopback without an admin key.
    assert (await call(proxy, "GET", "/admin/policies"))[0] == 200


# --- where a key is presented: the places the wires name ------------------------------------


async def test_a_key_is_read_where_some_wire_says_its_clients_send_it(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim_server: TestServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bearer, and each registered wire's key header and query (Anthropic's x-api-key,
    Google's x-goog-api-key and ?key=); a header no wire names is no key. A key sent in the
    query is never logged."""
    proxy = await start(start_proxy, tmp_path, sim_server, KEYS)
    caplog.set_level(logging.INFO)
    for headers, query in [
        ({"x-api-key": "sk-alice"}, {}),
        ({"x-goog-api-key": "sk-alice"}, {}),
        ({}, {"key": "sk-alice"}),
    ]:
        status, _ = await call(proxy, "GET", "/v1/models", headers, params=query)
        assert status == 200, (headers, query)
    assert (await call(proxy, "GET", "/v1/models", {"x-own-key": "sk-alice"}))[0] == 401
    assert "sk-alice" not in caplog.text and "/v1/models" in caplog.text


def _own_wire() -> WireFormat:
    return WireFormat(
        name="own",
        routes=web.RouteTableDef(),
        model_route=None,
        provider="own",
        assembly=ChatAnswer,
        conversation=ChatConversation(),
        key_headers=("x-own-key",),
        key_query="own_key",
    )


async def test_a_wire_added_to_the_registry_brings_its_key_places(aiohttp_server: Any) -> None:
    """Authentication names no wire: it reads the places the registry hands it."""
    places = key_places((*WIRES, _own_wire()))
    assert "x-own-key" in places.headers and "own_key" in places.queries
    app = web.Application()
    app[KEY_PLACES] = places

    async def echo(request: web.Request) -> web.Response:
        return web.Response(text=presented_key(request) or "-")

    app.router.add_get("/", echo)
    server: TestServer = await aiohttp_server(app)
    assert await call(server, "GET", "/", {"x-own-key": "k1"}) == (200, "k1")
    assert await call(server, "GET", "/", params={"own_key": "k2"}) == (200, "k2")
    assert await call(server, "GET", "/", {"x-goog-api-key": "k3"}) == (200, "k3")
    assert await call(server, "GET", "/", {"x-unnamed-key": "k4"}) == (200, "-")
    app2 = web.Application()  # no places handed: Bearer alone
    app2.router.add_get("/", echo)
    bare: TestServer = await aiohttp_server(app2)
    assert await call(bare, "GET", "/", {"x-api-key": "k5"}) == (200, "-")
    assert await call(bare, "GET", "/", {"Authorization": "Bearer k6"}) == (200, "k6")
