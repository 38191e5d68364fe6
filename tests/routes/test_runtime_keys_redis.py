"""Keys made at run time with two replicas on one Redis: a key made at one works at the other
within a second, a revoked or rotated-away secret is refused at once where it was revoked and
within a second at the other, the audit is one for both, and the keys outlive the processes.
Authentication never waits on the store: with Redis gone, a run-time key still gets in."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import REDIS_URL, OwnRedis, ProxyFactory, sim_config, start_redis
from tests.test_replicas import proxies

ADMIN_KEY = "admin-secret-replicas"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}
WITHIN_S = 1.0


def config(sim_url: str, store: str) -> str:
    keys = f"keys:\n  admin_key: {ADMIN_KEY}\n  api_keys:\n    - {{name: alice, key: sk-alice-r}}\n"
    return sim_config(sim_url, f"{store}\n{keys}")


async def admin(
    http: aiohttp.ClientSession, url: str, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    async with http.request(method, url + path, json=body, headers=ADMIN) as response:
        return response.status, await response.json()


async def status_with(http: aiohttp.ClientSession, url: str, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    async with http.post(url + "/v1/chat/completions", json=CHAT, headers=headers) as response:
        await response.read()
        return response.status


async def until(http: aiohttp.ClientSession, url: str, key: str, status: int) -> float:
    """Seconds until a request with `key` gets `status` (fails past 3 s)."""
    start = time.monotonic()
    while (got := await status_with(http, url, key)) != status:
        assert time.monotonic() - start < 3.0, f"still {got}"
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def test_two_replicas_see_a_keys_changes_within_a_second(
    aiohttp_server: Any, tmp_path: Path, redis_prefix: str
) -> None:
    upstream: TestServer = await aiohttp_server(Simulator().app())
    store = (
        f"store: {{backend: redis, url: {REDIS_URL}, prefix: '{redis_prefix}', path: {tmp_path}}}"
    )
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), store))
    async with proxies(path, 2) as (one, two), aiohttp.ClientSession() as http:
        status, made = await admin(http, one.url, "POST", "/admin/keys", {"name": "bot"})
        assert status == 201, made
        assert await status_with(http, one.url, made["key"]) == 200  # at once where made
        assert await until(http, two.url, made["key"], 200) < WITHIN_S

        status, rotated = await admin(http, two.url, "POST", "/admin/keys/bot/rotate", {})
        assert status == 200, rotated
        assert await status_with(http, two.url, made["key"]) == 401
        assert await until(http, one.url, made["key"], 401) < WITHIN_S
        assert await until(http, one.url, rotated["key"], 200) < WITHIN_S

        assert (await admin(http, one.url, "DELETE", "/admin/keys/bot"))[0] == 200
        assert await status_with(http, one.url, rotated["key"]) == 401  # at once here
        assert await until(http, two.url, rotated["key"], 401) < WITHIN_S

        _, again = await admin(http, two.url, "POST", "/admin/keys", {"name": "keeper"})
        _, listed = await admin(http, one.url, "GET", "/admin/keys")
        assert [k["name"] for k in listed["keys"]] == ["alice", "keeper"]
        _, audit_one = await admin(http, one.url, "GET", "/admin/audit")
        _, audit_two = await admin(http, two.url, "GET", "/admin/audit")
    assert audit_one == audit_two  # one audit for both replicas
    assert [e["action"] for e in audit_one["entries"]] == [
        "key.create",
        "key.revoke",
        "key.rotate",
        "key.create",
    ]
    everything = str(audit_one)
    assert made["key"] not in everything and rotated["key"] not in everything

    async with proxies(path, 1) as (restarted,), aiohttp.ClientSession() as http:
        assert await status_with(http, restarted.url, again["key"]) == 200  # kept in Redis


async def test_authentication_never_waits_on_the_store(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, own_redis: OwnRedis
) -> None:
    port, processes = own_redis
    start_redis(port, processes)
    upstream: TestServer = await aiohttp_server(Simulator().app())
    url = f"redis://127.0.0.1:{port}/0"
    # A stopped Redis refuses connections at once: the timeout only bounds a loaded machine's
    # first write (0.2 s failed it under a full suite).
    store = f"store: {{backend: redis, url: {url}, path: {tmp_path}, timeout_s: 2}}"
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), store))
    proxy = await start_proxy(path, watch=False)
    base = str(proxy.make_url("")).rstrip("/")
    async with aiohttp.ClientSession() as http:
        status, made = await admin(http, base, "POST", "/admin/keys", {"name": "bot"})
        assert status == 201, made
        for process in processes:
            process.terminate()
            process.wait(5)
        await asyncio.sleep(1.2)  # a poll or two failed meanwhile: the keys stay as they were
        assert await status_with(http, base, made["key"]) == 200
        assert await status_with(http, base, "sk-ap-not-a-key") == 401
        status, refused = await admin(http, base, "POST", "/admin/keys", {"name": "other"})
    assert status == 503, refused  # a change needs the store: said, not a bare 500
