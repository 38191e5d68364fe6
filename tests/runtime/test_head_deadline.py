"""A connection must send a whole request head within `server.head_timeout_s` (issue 29 §7b):
silent connections, heads that stop halfway and slowloris clients dripping a header byte at a
time are cut at the deadline, a partial head with a 408 in the wire format of the route it
began to name; a normal request is served and a kept-alive idle connection stays open (the
keep-alive timeout governs it). Raw sockets, a real proxy, and `agentproxy serve` itself."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory, sim_config
from tests.routes.test_hostile_clients import (
    AUTH,
    GOOD,
    assert_serves,
    post,
    read_answer,
    start,
)
from tests.support.scrape import metrics_of, sample
from tests.test_cli import start_serve

HEAD_TIMEOUT = 0.6
SETTINGS = f"server: {{head_timeout_s: {HEAD_TIMEOUT}}}"
RESET = b"(reset)"
PARTIAL = b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n"


async def closed_within(reader: asyncio.StreamReader, bound: float) -> tuple[bytes, float]:
    """What the proxy sent before it closed the connection, and when it closed it."""
    began = time.monotonic()
    try:
        sent = await asyncio.wait_for(reader.read(), bound)
    except ConnectionResetError:  # closed while the client was still sending: a reset
        sent = RESET
    return sent, time.monotonic() - began


async def drip(writer: asyncio.StreamWriter, data: bytes, every: float) -> None:
    """A slowloris: one byte of the head at a time, never silent for long."""
    for byte in data:
        if writer.is_closing():
            return
        writer.write(bytes([byte]))
        await asyncio.sleep(every)


async def test_heads_that_never_finish_are_cut_at_the_deadline(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, SETTINGS)
    silent = [await asyncio.open_connection("127.0.0.1", proxy.port) for _ in range(100)]
    # Each head begins as its connection opens: opening a hundred can take longer than the
    # deadline on a loaded machine, and a connection still silent then is rightly cut silent.
    halfway: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for _ in range(100):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(PARTIAL)
        halfway.append((reader, writer))
    endless_head = PARTIAL + b"x-pad: " + b"a" * 2000
    slow: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    drips: list[asyncio.Task[None]] = []
    for _ in range(100):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        drips.append(asyncio.create_task(drip(writer, endless_head, 0.05)))
        slow.append((reader, writer))
    try:
        await assert_serves(proxy)  # meanwhile a normal request is served
        results = await asyncio.gather(
            *(closed_within(reader, HEAD_TIMEOUT + 3) for reader, _ in silent + halfway + slow)
        )
    finally:
        for task in drips:
            task.cancel()
        for _, writer in silent + halfway + slow:
            writer.close()
    assert max(elapsed for _, elapsed in results) < HEAD_TIMEOUT + 1.5
    assert {sent for sent, _ in results[:100]} == {b""}  # nothing asked, nothing answered
    for sent, _ in results[100:200]:  # a head began: told why, in OpenAI's shape
        assert sent.startswith(b"HTTP/1.1 408 "), sent[:200]
        error = orjson.loads(sent.split(b"\r\n\r\n", 1)[1])["error"]
        assert error["code"] == "request_timeout" and "server.head_timeout_s" in error["message"]
    # A slowloris still sending when cut may see a reset rather than its 408.
    assert all(sent.startswith(b"HTTP/1.1 408 ") or sent == RESET for sent, _ in results[200:])
    # Each 408 is counted; a slowloris whose first byte came only after its deadline (a loaded
    # machine: client and proxy share this loop) was cut silent, its drip then reset.
    told = sum(sent.startswith(b"HTTP/1.1 408 ") for sent, _ in results[100:])
    late = sample(
        await metrics_of(proxy), "agentproxy_requests_total", route="unmatched", model="-",
        status="408",
    )  # fmt: skip
    assert told <= late <= 200
    await assert_serves(proxy)


async def test_a_partial_anthropic_head_is_answered_in_anthropic_s_shape(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, SETTINGS)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\nanthropic-ver")
    sent, _ = await closed_within(reader, HEAD_TIMEOUT + 3)
    writer.close()
    assert sent.startswith(b"HTTP/1.1 408 ")
    body = orjson.loads(sent.split(b"\r\n\r\n", 1)[1])
    assert body["type"] == "error" and body["error"]["type"] == "timeout_error"


async def test_a_kept_alive_idle_connection_outlives_the_head_deadline(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    """Between requests a connection is idle, not late: the keep-alive timeout governs it. The
    next head, once begun, has the deadline again."""
    proxy = await start(start_proxy, tmp_path, sim_server, SETTINGS)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        for _ in range(2):
            writer.write(post(GOOD))
            assert (await asyncio.wait_for(read_answer(reader), 10)).status == 200
            await asyncio.sleep(HEAD_TIMEOUT * 2.5)  # idle, kept alive
        writer.write(PARTIAL[:20])  # the third head begins and stops
        sent, elapsed = await closed_within(reader, HEAD_TIMEOUT + 3)
        assert sent.startswith(b"HTTP/1.1 408 ") and elapsed < HEAD_TIMEOUT + 1
    finally:
        writer.close()


async def test_agentproxy_serve_cuts_a_head_that_never_finishes(
    tmp_path: Path, sim_server: TestServer
) -> None:
    config = tmp_path / "agentproxy.yaml"
    extra = f"{SETTINGS}\nstore: {{path: {tmp_path}}}\n"
    config.write_text(sim_config(str(sim_server.make_url("")).rstrip("/"), extra))
    process, url = await start_serve(config)
    try:
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        slowloris = asyncio.create_task(drip(writer, PARTIAL + AUTH * 100, 0.05))
        sent, elapsed = await closed_within(reader, HEAD_TIMEOUT + 3)
        slowloris.cancel()
        writer.close()
        assert sent.startswith(b"HTTP/1.1 408 ") or sent == RESET
        assert elapsed < HEAD_TIMEOUT + 1.5
    finally:
        process.terminate()
        await asyncio.wait_for(process.communicate(), timeout=10)
