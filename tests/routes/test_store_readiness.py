"""A store that takes no writes: start-up refuses it, /readyz reports it, and the overflow that
follows a failed offload says the store failed (unavailable, or full of live sessions), not
the request."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from proxy.store.base import StoreError
from tests.conftest import OwnRedis, ProxyFactory, free_port, sim_config, start_redis

BIG = "".join(f"row {n}: value {n * 7}\n" for n in range(2_000))  # ~10k tokens


def redis_config(sim_url: str, port: int) -> str:
    # The proxy believes in a large window (no proactive compaction); the model has 4k.
    return sim_config(
        sim_url,
        textwrap.dedent(
            f"""\
            store: {{backend: redis, url: "redis://127.0.0.1:{port}/0", prefix: "full:",
                     timeout_s: 0.5}}
            policies:
              - name: offloading
                offload: {{min_tokens: 2000}}
            """
        ),
        window=100_000,
    )


def redis_cli(port: int, *args: str) -> None:
    subprocess.run(["redis-cli", "-p", str(port), *args], check=True, capture_output=True)


async def ask(http: aiohttp.ClientSession, proxy: TestServer, index: int) -> tuple[int, str, Any]:
    """A turn whose tool result (new each time: stored ones are not written again) needs
    offloading to fit the model."""
    call = {"id": "c1", "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "big.txt"}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": f"file {index}\n{BIG}"},
    ]
    body = {"model": "sim", "messages": messages}
    headers = {"x-agentproxy-session": f"s{index}"}
    url = proxy.make_url("/v1/chat/completions")
    async with http.post(url, json=body, headers=headers) as response:
        applied = response.headers.get("x-agentproxy-applied", "")
        return response.status, applied, await response.json()


async def readyz(http: aiohttp.ClientSession, proxy: TestServer) -> tuple[int, Any]:
    async with http.get(proxy.make_url("/readyz")) as response:
        return response.status, await response.json()


async def until_ready(http: aiohttp.ClientSession, proxy: TestServer, ready: bool) -> Any:
    """/readyz checks at most once a second, and Redis pauses a second after a failure."""
    for _ in range(60):
        status, body = await readyz(http, proxy)
        if (status == 200) == ready:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"/readyz never became {'ready' if ready else 'not ready'}: {body}")


async def test_a_full_redis_is_not_ready_and_the_overflow_blames_the_store(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, own_redis: OwnRedis
) -> None:
    port, processes = own_redis
    start_redis(port, processes)
    sim = Simulator(context_window=4_000)
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(redis_config(str(upstream.make_url("")).rstrip("/"), port))
    proxy = await start_proxy(path)  # waits for this Redis to answer

    async with aiohttp.ClientSession() as http:
        ready = await until_ready(http, proxy, ready=True)
        assert ready["store"] == {"backend": "redis", "writable": True}
        status, applied, _ = await ask(http, proxy, 1)
        assert status == 200 and "offload.offloaded" in applied

        redis_cli(port, "config", "set", "maxmemory", "1")  # full: every write is refused
        await asyncio.sleep(1.1)  # past the health check's memory of the last answer
        not_ready = await until_ready(http, proxy, ready=False)
        assert not_ready["status"] == "store_unavailable"
        assert not_ready["store"]["backend"] == "redis"
        assert not_ready["store"]["writable"] is False
        assert "maxmemory" in not_ready["store"]["error"]

        status, applied, body = await ask(http, proxy, 2)
        assert status == 400 and "offload.store_failed" in applied
        error = body["error"]
        assert error["code"] == "context_length_exceeded"  # the provider's, with ours added
        assert (
            "offloading failed because the proxy's store is unavailable or read-only"
            in (error["store_error"])
        )
        assert "store" in error["guidance"] and error["request_id"]

        redis_cli(port, "config", "set", "maxmemory", "0")
        await until_ready(http, proxy, ready=True)
        await asyncio.sleep(1.1)  # Redis' fail-fast pause after the last failure
        status, applied, _ = await ask(http, proxy, 3)
        assert status == 200 and "offload.offloaded" in applied


async def test_start_up_refuses_a_local_store_it_cannot_write(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("not a directory")  # ENOTDIR even for root, unlike chmod
    path = tmp_path / "agentproxy.yaml"
    url = str(sim_server.make_url("")).rstrip("/")
    path.write_text(sim_config(url, f"store: {{path: {in_the_way}/data}}\n"))
    with pytest.raises(StoreError, match=r"store.backend: local\) is not writable: .*a-file/data"):
        await start_proxy(path)


async def test_start_up_refuses_an_unreachable_redis_without_showing_its_password(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim_server: TestServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()  # nothing listens there
    path = tmp_path / "agentproxy.yaml"
    url = str(sim_server.make_url("")).rstrip("/")
    store = f'store: {{backend: redis, url: "redis://:hunter2@127.0.0.1:{port}/0"}}\n'
    path.write_text(sim_config(url, store))
    with caplog.at_level(logging.WARNING), pytest.raises(StoreError) as refused:
        await start_proxy(path)
    assert f"redis://***@127.0.0.1:{port}/0" in str(refused.value)
    assert "hunter2" not in str(refused.value) and "hunter2" not in caplog.text


async def test_a_store_full_of_live_sessions_is_named_in_the_overflow(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    """At store.max_mb with every session live, offloads are refused; the overflow that
    follows says the store is full and what the operator can change."""
    sim = Simulator(context_window=4_000)
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    extra = textwrap.dedent(
        f"""\
        store: {{path: {tmp_path / "data"}, max_mb: 1, live_s: 3600}}
        policies:
          - name: offloading
            offload: {{min_tokens: 2000}}
        """
    )
    path.write_text(sim_config(str(upstream.make_url("")).rstrip("/"), extra, window=100_000))
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession() as http:
        for index in range(200):  # ~40 KB each: the cap is reached after a few dozen
            status, applied, body = await ask(http, proxy, index)
            if status != 200:
                break
            assert "offload.offloaded" in applied
        else:
            raise AssertionError("200 offloads of ~40 KB never filled a 1 MB store")
    assert status == 400 and "offload.store_failed" in applied
    error = body["error"]
    assert error["code"] == "context_length_exceeded"
    assert "the proxy's store is full (store.max_mb)" in error["store_error"]
    assert "store.max_mb" in error["guidance"] and "store.live_s" in error["guidance"]
