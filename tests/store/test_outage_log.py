"""A Redis outage under traffic: the proxy goes on (guards fail as declared) and says so in
the log a bounded number of times, not once per request (issue 29: 4,983 lines)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.logs.limit import forget, warn_limited
from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory, base_url, sim_config

REDIS_PORT = 6379


class Relay:
    """A TCP relay to the machine's Redis on 127.0.0.1 that can be cut: its port then refuses
    connections, as a Redis that went away."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", REDIS_PORT)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()
        await self.server.wait_closed()


async def test_a_redis_outage_logs_a_bounded_number_of_lines(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    redis_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = Simulator()
    upstream = await aiohttp_server(sim.app())
    relay = Relay()
    port = await relay.start()
    store = (
        f"store: {{backend: redis, url: 'redis://127.0.0.1:{port}/0', prefix: '{redis_prefix}'}}"
    )
    policy = """
        policies:
          - name: guarded
            loops: {window: 6, repeats: 3}
            budgets:
              - {name: turns, scope: session, limits: {calls: 1000}}
    """
    path = tmp_path / "proxy.yaml"
    url = str(upstream.make_url("")).rstrip("/")
    path.write_text(sim_config(url, store + "\n" + textwrap.dedent(policy)))
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession() as http:

        async def chat(index: int) -> int:
            body = {"model": "sim", "messages": [{"role": "user", "content": f"hi {index}"}]}
            headers = {"x-agentproxy-session": f"s{index % 20}"}
            async with http.post(
                base_url(proxy) + "/chat/completions", json=body, headers=headers
            ) as response:
                await response.read()
                return response.status

        assert await chat(0) == 200
        await relay.cut()
        caplog.clear()
        caplog.set_level(logging.INFO)
        statuses = [await chat(index) for index in range(200)]
    assert statuses.count(200) > 0
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    text = "\n".join(f"{r.name} {r.getMessage()}" for r in lines)
    assert len(lines) <= 20, f"{len(lines)} lines:\n{text[:3000]}"


async def test_repeats_are_said_in_one_summary_line_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("agentproxy.test-log-limit")
    caplog.set_level(logging.WARNING, logger=logger.name)
    for index in range(500):
        warn_limited(
            logger, "test.kind", "write %d failed: %s", index, "not answering", interval_s=0.2
        )
    assert [r.getMessage() for r in caplog.records] == ["write 0 failed: not answering"]
    await asyncio.sleep(0.3)
    assert (
        caplog.records[-1]
        .getMessage()
        .startswith("write 499 failed: not answering (repeated 499 times in the last 0 s)")
    )
    await asyncio.sleep(0.3)  # a quiet interval: forgotten, the next one is said at once
    warn_limited(logger, "test.kind", "write %d failed: %s", 500, "back", interval_s=0.2)
    assert len(caplog.records) == 3 and caplog.records[-1].getMessage() == "write 500 failed: back"
    forget()
