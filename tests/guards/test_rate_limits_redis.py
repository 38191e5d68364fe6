"""Rate limits held in Redis are every replica's: two proxy processes on one Redis refuse the
request past a key's limit whichever of them serves it, a slot one holds refuses a request at
the other until it is given back, and a Redis that does not answer lets requests through or
refuses them as the limit declares."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import REDIS_URL, OwnRedis, ProxyFactory, sim_config, start_redis
from tests.test_replicas import proxies

ALICE, BOB = "sk-redis-rate-alice", "sk-redis-rate-bob"
CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}


def config(sim_url: str, store: str, alice: str, policy: str = "") -> str:
    return sim_config(
        sim_url,
        textwrap.dedent(
            f"""\
            {store}
            keys:
              api_keys:
                - {{name: alice, key: {ALICE}, limits: {{{alice}}}}}
                - {{name: bob, key: {BOB}}}
            """
        )
        + policy,
    )


async def post(
    http: aiohttp.ClientSession, url: str, key: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"}
    async with http.post(url + "/v1/chat/completions", json=body or CHAT, headers=headers) as r:
        return r.status, await r.json()


async def test_two_replicas_share_a_keys_window(
    aiohttp_server: Any, tmp_path: Path, redis_prefix: str
) -> None:
    sim = Simulator(context_window=8192, api_key="sk-sim-upstream-secret")
    upstream: TestServer = await aiohttp_server(sim.app())
    store = (
        f"store: {{backend: redis, url: {REDIS_URL}, prefix: '{redis_prefix}', path: {tmp_path}}}"
    )
    policy = "policies:\n  - {name: agents, limits: {global: {rpm: 100}}}\n"
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), store, "rpm: 3", policy))
    async with proxies(path, 2) as (one, two), aiohttp.ClientSession() as http:
        statuses = [(await post(http, (one, two)[n % 2].url, ALICE))[0] for n in range(5)]
        # Three a minute between them, not three each.
        assert statuses == [200, 200, 200, 429, 429]
        status, body = await post(http, one.url, BOB)  # another key: its own window
        assert status == 200, body
        async with http.get(two.url + "/metrics") as response:
            metrics = await response.text()
    assert len(sim.requests) == 4
    assert 'agentproxy_rate_limited_total{limit="rpm",scope="key"} 1.0' in metrics


async def test_a_slot_held_at_one_replica_refuses_at_the_other_until_its_stream_is_cancelled(
    aiohttp_server: Any, tmp_path: Path, redis_prefix: str
) -> None:
    sim = Simulator(context_window=8192, api_key="sk-sim-upstream-secret", chunk_delay_s=0.2)
    upstream: TestServer = await aiohttp_server(sim.app())
    store = (
        f"store: {{backend: redis, url: {REDIS_URL}, prefix: '{redis_prefix}', path: {tmp_path}}}"
    )
    path = tmp_path / "agentproxy.yaml"
    path.write_text(
        config(str(upstream.make_url("")).rstrip("/"), store, "max_concurrent: 1, tpm: 100000")
    )
    async with proxies(path, 2) as (one, two), aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {ALICE}"}
        streamed = {**CHAT, "stream": True, "max_tokens": 200}
        response = await http.post(one.url + "/v1/chat/completions", json=streamed, headers=headers)
        assert response.status == 200
        await response.content.readline()
        status, body = await post(http, two.url, ALICE)
        assert status == 429 and body["error"]["rate_limit"]["limit"] == "max_concurrent"
        response.close()  # the client leaves: replica one gives the slot back in Redis
        for _ in range(60):
            await asyncio.sleep(0.05)
            status, body = await post(http, two.url, ALICE)
            if status == 200:
                break
        assert status == 200, body


async def test_redis_down_fails_open_or_closed_as_the_limit_declares(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, own_redis: OwnRedis
) -> None:
    port, processes = own_redis
    start_redis(port, processes)
    redis = f"redis://127.0.0.1:{port}/0"
    store = f"store: {{backend: redis, url: '{redis}', timeout_s: 2, path: {tmp_path}}}"
    url = str(sim_server.make_url("")).rstrip("/")
    closed = (
        "policies:\n  - name: closed\n    match: {headers: {x-closed: 'yes'}}\n"
        "    limits: {key: {rpm: 5, on_store_error: refuse}}\n"
    )
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(url, store, "rpm: 1", closed))
    proxy = await start_proxy(path)
    base = str(proxy.make_url("")).rstrip("/")
    async with aiohttp.ClientSession() as http:
        assert (await post(http, base, ALICE))[0] == 200
        assert (await post(http, base, ALICE))[0] == 429  # Redis answers: rpm 1 holds
        processes[0].terminate()
        processes[0].wait(5)
        headers = {"Authorization": f"Bearer {ALICE}"}
        for _ in range(2):  # rpm 1 cannot be counted: through, unchecked (the default)
            async with http.post(base + "/v1/chat/completions", json=CHAT, headers=headers) as r:
                assert r.status == 200, await r.text()
                assert "rate_limit.unchecked" in r.headers["x-agentproxy-applied"]
        headers["x-closed"] = "yes"  # a policy whose limit says refuse
        async with http.post(base + "/v1/chat/completions", json=CHAT, headers=headers) as r:
            assert r.status == 503
            assert r.headers["Retry-After"] == "1"
            body = await r.json()
        assert body["error"]["code"] == "rate_limit_unavailable"
