"""The inspector's page and files over real sockets: served as the admin routes are (to anyone
when the proxy has keys, loopback only without), with their content types and a
Content-Security-Policy that keeps every load on the proxy's own origin; and the archive route
it reads archived items from, which the admin key reads for every tenant."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer, make_mocked_request

from proxy.errors import Unauthorized
from proxy.http.auth import HOST_NAMES, HostNames
from proxy.policies.spec import ApiKey, Keys, ServerSettings, key_digest
from proxy.routes import ui
from proxy.state import STORE
from proxy.store.base import BlobInfo, content_ref
from tests.conftest import ProxyFactory, sim_config

ADMIN = {"Authorization": "Bearer admin-secret"}
ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}
KEYS = """
keys:
  admin_key: admin-secret
  api_keys:
    - {name: alice, key: sk-alice}
    - {name: bob, key: sk-bob}
"""


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, extra: str = ""
) -> TestServer:
    path = tmp_path / "agentproxy.yaml"
    url = str(sim_server.make_url("")).rstrip("/")
    path.write_text(sim_config(url, f"{extra}\nstore: {{path: {tmp_path / 'data'}}}\n"))
    return await start_proxy(path)


async def get(
    server: TestServer, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as http:
        url = str(server.make_url(path))
        async with http.get(url, headers=headers or {}, allow_redirects=False) as r:
            return r.status, dict(r.headers), await r.read()


@pytest.mark.parametrize("keys", ["", KEYS])
async def test_the_page_and_its_files_have_their_types_and_forbid_remote_loads(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, keys: str
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, keys)
    types = {
        "/ui": "text/html; charset=utf-8",
        "/ui/inspector.js": "text/javascript; charset=utf-8",
        "/ui/inspector.css": "text/css; charset=utf-8",
        "/ui/favicon.svg": "image/svg+xml",
    }
    for path, kind in types.items():
        status, headers, body = await get(proxy, path)
        assert status == 200, path
        assert headers["Content-Type"] == kind
        assert headers["X-Content-Type-Options"] == "nosniff"
        csp = dict(
            part.strip().split(" ", 1) for part in headers["Content-Security-Policy"].split(";")
        )
        assert csp["default-src"] == "'none'"
        for directive in ("script-src", "style-src", "img-src", "connect-src"):
            assert csp[directive] == "'self'", directive  # no host, no inline, no data:
        assert csp["frame-ancestors"] == "'none'"
        assert body
    _, _, page = await get(proxy, "/ui")
    # Nothing the page names loads from elsewhere, and no script is inline.
    assert not re.search(rb"""(src|href)=["'](https?:)?//""", page)
    assert re.findall(rb"<script[^>]*>", page) == [b'<script src="/ui/inspector.js" defer>']
    # The page says whether a key is needed: not on loopback without an admin key.
    assert (b'data-key="required"' in page) == bool(keys)
    assert (await get(proxy, "/ui/"))[0] == 302
    for unknown in ("/ui/index.html", "/ui/..%2fapp.py", "/ui/nothing.js"):
        assert (await get(proxy, unknown))[0] == 404, unknown


def test_without_keys_the_page_serves_loopback_clients_only() -> None:
    """A remote address cannot be had over loopback sockets: the check, on a request from one."""
    remote = make_mocked_request("GET", "/ui", transport=_Transport("203.0.113.9"))
    with pytest.raises(Unauthorized):
        ui._admit(remote, Keys())
    ui._admit(remote, Keys(admin_digest=key_digest("admin-secret")))  # a key gates the data
    ui._admit(remote, Keys(api_keys=(ApiKey(name="a", digest=key_digest("sk-a")),)))
    app = web.Application()
    app[HOST_NAMES] = HostNames(ServerSettings)  # the names the local user calls it by
    local = make_mocked_request("GET", "/ui", transport=_Transport("127.0.0.1"), app=app)
    ui._admit(local, Keys())


class _Transport:
    def __init__(self, host: str) -> None:
        self.host = host

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.host, 40000) if name == "peername" else default


async def stored(server: TestServer, text: str, owner: str) -> str:
    data = text.encode()
    ref = content_ref(f"{owner}/s1", "tool_result", data)
    info = BlobInfo(ref, f"{owner}/s1", "tool_result", len(data), time.time() - 1, owner, {})
    await server.app[STORE].put(info, data)
    return ref


async def test_the_admin_key_reads_every_tenants_archive_a_key_its_own(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, KEYS)
    ref = await stored(proxy, "alice's full tool result", "key:alice")
    status, _, body = await get(proxy, f"/v1/agentproxy/archive/{ref}", ADMIN)
    assert status == 200 and b"alice's full tool result" in body
    assert (await get(proxy, f"/v1/agentproxy/archive/{ref}", ALICE))[0] == 200
    assert (await get(proxy, f"/v1/agentproxy/archive/{ref}", BOB))[0] == 404
    assert (await get(proxy, f"/v1/agentproxy/archive/{ref}"))[0] == 401
    wrong = {"Authorization": "Bearer not-the-admin"}
    assert (await get(proxy, f"/v1/agentproxy/archive/{ref}", wrong))[0] == 401


async def test_without_an_admin_key_nobody_reads_another_tenants_archive(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    """Loopback sees every session then (as every admin route), but the archive stays walled:
    the admin read needs the admin key itself."""
    keys = KEYS.replace("  admin_key: admin-secret\n", "")
    proxy = await start(start_proxy, tmp_path, sim_server, keys)
    ref = await stored(proxy, "alice's result", "key:alice")
    assert (await get(proxy, f"/v1/agentproxy/archive/{ref}"))[0] == 401
    assert (await get(proxy, f"/v1/agentproxy/archive/{ref}", ADMIN))[0] == 401
    assert (await get(proxy, f"/v1/agentproxy/archive/{ref}", BOB))[0] == 404
    assert (await get(proxy, f"/v1/agentproxy/archive/{ref}", ALICE))[0] == 200


def test_the_route_module_serves_only_listed_files() -> None:
    assert set(ui.ASSETS) == {"inspector.js", "inspector.css", "favicon.svg"}
    assert isinstance(ui.routes, web.RouteTableDef)
