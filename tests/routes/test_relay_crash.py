"""A bug in the relay after the stream began (bytes already reached the client) ends the stream
with an error event in the client's wire, logged with its traceback and counted as a failed
request; the client is never left hanging on an open connection."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.sim.simulator import Simulator
from proxy.wire.relay import StreamRelay
from tests.conftest import ProxyFactory
from tests.routes.test_first_token import KEY, REQUESTS, body_for, start


@pytest.mark.parametrize("wire", sorted(REQUESTS))
async def test_a_relay_that_crashes_mid_stream_ends_it_with_an_error_event(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    wire: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    write = StreamRelay.write
    writes = 0

    async def crashing_write(self: StreamRelay, data: bytes) -> None:
        nonlocal writes
        writes += 1
        if writes == 3:  # after the stream began
            raise RuntimeError("a bug in the relay")
        await write(self, data)

    monkeypatch.setattr(StreamRelay, "write", crashing_write)
    sim = Simulator(api_key=KEY, chunk_delay_s=0.01)
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()))
    path, _ = REQUESTS[wire]
    headers = {"x-api-key": KEY, "authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            proxy.make_url(path), json=body_for(wire, stream=True), headers=headers
        ) as response:
            assert response.status == 200
            text = (await asyncio.wait_for(response.read(), 10)).decode()
    assert "the proxy failed while relaying" in text and "a bug in the relay" not in text
    assert "Traceback" not in text
    assert "relay" in caplog.text and "RuntimeError: a bug in the relay" in caplog.text
