"""People read archived content over HTTP, only with the key that created it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.app import build_app
from proxy.state import STORE
from proxy.store.base import BlobInfo, Store, content_ref
from tests.conftest import sim_config

ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}
KEYS = """
keys:
  api_keys:
    - name: alice
      key: sk-alice
    - name: bob
      key: sk-bob
"""


async def start(aiohttp_server: Any, tmp_path: Path, sim_url: str, extra: str) -> TestServer:
    data = tmp_path / "data"
    path = tmp_path / "agentproxy.yaml"
    path.write_text(sim_config(sim_url, f"{extra}\nstore:\n  path: {data}\n"))
    app = build_app(path, watch=False)  # wires app[STORE] = LocalStore(store.path)
    server: TestServer = await aiohttp_server(app)
    return server


@pytest.fixture
async def proxy(aiohttp_server: Any, tmp_path: Path, sim_server: TestServer) -> TestServer:
    return await start(aiohttp_server, tmp_path, str(sim_server.make_url("")).rstrip("/"), KEYS)


async def archived(
    store: Store, session: str, text: str, owner: str | None, at: float = 1.0
) -> BlobInfo:
    """A blob written `at` seconds into the last minute (recent: retention keeps it)."""
    data = text.encode()
    ref = content_ref(session, "tool_result", data)
    meta = {"tool": "read_file", "tool_call_id": "call_1"}
    info = BlobInfo(ref, session, "tool_result", len(data), time.time() - 60 + at, owner, meta)
    await store.put(info, data)
    return info


async def fetch(server: TestServer, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.get(str(server.make_url(path)), headers=headers) as r:
            if r.content_type == "application/json":
                return r.status, await r.json()
            return r.status, (r.content_type, await r.text())


async def test_the_creating_key_reads_the_content(proxy: TestServer) -> None:
    info = await archived(proxy.app[STORE], "s1", "full result ✓\nline 2\n", "alice")
    status, body = await fetch(proxy, f"/v1/agentproxy/archive/{info.ref}", ALICE)
    assert status == 200
    assert body == {
        "ref": info.ref,
        "session": "s1",
        "kind": "tool_result",
        "size": len("full result ✓\nline 2\n".encode()),
        "created_at": info.created_at,
        "meta": {"tool": "read_file", "tool_call_id": "call_1"},
        "content": "full result ✓\nline 2\n",
    }


async def test_raw_returns_the_bytes_as_text(proxy: TestServer) -> None:
    info = await archived(proxy.app[STORE], "s1", "raw ✓ bytes\n", "alice")
    status, (content_type, text) = await fetch(
        proxy, f"/v1/agentproxy/archive/{info.ref}?raw=1", ALICE
    )
    assert (status, content_type, text) == (200, "text/plain", "raw ✓ bytes\n")


async def test_another_key_gets_the_same_404_as_an_unknown_ref(proxy: TestServer) -> None:
    info = await archived(proxy.app[STORE], "s1", "alice's secret", "alice")
    status, theirs = await fetch(proxy, f"/v1/agentproxy/archive/{info.ref}", BOB)
    unknown_ref = "ap_" + "0" * 24
    _, unknown = await fetch(proxy, f"/v1/agentproxy/archive/{unknown_ref}", BOB)
    assert status == 404 and theirs["error"]["code"] == unknown["error"]["code"] == "not_found"
    assert theirs["error"]["message"].replace(info.ref, unknown_ref) == unknown["error"]["message"]


async def test_no_key_is_401(proxy: TestServer) -> None:
    info = await archived(proxy.app[STORE], "s1", "anything", "alice")
    for path in (f"/v1/agentproxy/archive/{info.ref}", "/v1/agentproxy/sessions/s1/archive"):
        status, body = await fetch(proxy, path, {})
        assert status == 401 and body["error"]["type"] == "authentication_error"


async def test_listing_is_newest_first_without_contents_and_only_mine(proxy: TestServer) -> None:
    store = proxy.app[STORE]
    old = await archived(store, "team/s1", "older", "alice", at=1.0)
    new = await archived(store, "team/s1", "newer", "alice", at=2.0)
    await archived(store, "team/s1", "bob's", "bob", at=3.0)
    await archived(store, "s2", "other session", "alice", at=4.0)
    status, body = await fetch(proxy, "/v1/agentproxy/sessions/team%2Fs1/archive", ALICE)
    assert status == 200 and body["object"] == "list" and body["session"] == "team/s1"
    assert [b["ref"] for b in body["data"]] == [new.ref, old.ref]
    assert all("content" not in b for b in body["data"])
    _, nothing = await fetch(proxy, "/v1/agentproxy/sessions/unknown/archive", ALICE)
    assert nothing["data"] == []


async def test_an_open_proxy_serves_only_unowned_blobs(
    aiohttp_server: Any, tmp_path: Path, sim_server: TestServer
) -> None:
    server = await start(aiohttp_server, tmp_path, str(sim_server.make_url("")).rstrip("/"), "")
    mine = await archived(server.app[STORE], "s1", "open proxy content", None)
    owned = await archived(server.app[STORE], "s1", "from a keyed era", "alice")
    status, body = await fetch(server, f"/v1/agentproxy/archive/{mine.ref}", {})
    assert status == 200 and body["content"] == "open proxy content"
    status, _ = await fetch(server, f"/v1/agentproxy/archive/{owned.ref}", {})
    assert status == 404


async def test_a_result_offloaded_through_the_proxy_is_readable_by_its_key_only(
    aiohttp_server: Any, tmp_path: Path, sim_server: TestServer
) -> None:
    policy = "policies:\n  - name: tight\n    offload: {min_tokens: 200}\n"
    sim_url = str(sim_server.make_url("")).rstrip("/")
    proxy = await start(aiohttp_server, tmp_path, sim_url, KEYS + policy)
    content = "".join(f"row {i}: some tool output\n" for i in range(200))
    call = {"id": "call_1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
    body = {
        "model": "sim",
        "messages": [
            {"role": "user", "content": "search"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": content},
        ],
    }
    headers = {**ALICE, "x-agentproxy-session": "e2e"}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            str(proxy.make_url("/v1/chat/completions")), json=body, headers=headers
        ) as r:
            assert r.status == 200, await r.text()
    _, listing = await fetch(proxy, "/v1/agentproxy/sessions/e2e/archive", ALICE)
    (entry,) = listing["data"]
    assert entry["meta"]["tool"] == "grep" and entry["meta"]["lines"] == 200
    status, blob = await fetch(proxy, f"/v1/agentproxy/archive/{entry['ref']}", ALICE)
    assert status == 200 and blob["content"] == content
    assert (await fetch(proxy, f"/v1/agentproxy/archive/{entry['ref']}", BOB))[0] == 404
    assert (await fetch(proxy, "/v1/agentproxy/sessions/e2e/archive", BOB))[1]["data"] == []
