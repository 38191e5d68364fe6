"""How a connection ends must not cost the request before it its answer: a client that pipelines
garbage after a valid request gets that request's whole answer, then a 400 for the garbage and
the connection closed; a client that sends a whole request and then half-closes its side
(shutdown(SHUT_WR), as `printf ... | nc -N` does) gets its answer before the proxy closes.
Raw sockets, a real proxy in front of the simulator, a model route and /healthz."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory
from tests.routes.test_hostile_clients import GOOD, post, read_answer, start

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n"
STREAMED = b'{"model":"sim","stream":true,"messages":[{"role":"user","content":"hi"}]}'
REQUESTS = {"model": post(GOOD), "healthz": HEALTHZ}
GARBAGE = {"not http": b"\x00\x01\x02garbage\r\n\r\n", "bad request line": b"HELLO\r\n\r\n"}


def assert_whole(route: str, status: int, body: bytes) -> None:
    assert status == 200, body
    if route == "model":
        answer = orjson.loads(body)
        assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]
    else:
        assert body


async def closed(reader: asyncio.StreamReader) -> bytes:
    """What else the proxy sent before it closed the connection (it must close it)."""
    return await asyncio.wait_for(reader.read(), 10)


@pytest.mark.parametrize("garbage", GARBAGE.values(), ids=GARBAGE.keys())
@pytest.mark.parametrize("together", [True, False], ids=["one write", "two writes"])
@pytest.mark.parametrize("route", REQUESTS)
async def test_pipelined_garbage_keeps_the_answer_before_it(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim_server: TestServer,
    route: str,
    together: bool,
    garbage: bytes,
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        if together:
            writer.write(REQUESTS[route] + garbage)
        else:
            writer.write(REQUESTS[route])
            await writer.drain()
            await asyncio.sleep(0.05)  # the request is being handled when the garbage comes
            writer.write(garbage)
        await writer.drain()
        first = await asyncio.wait_for(read_answer(reader), 10)
        assert_whole(route, first.status, first.body)
        second = await asyncio.wait_for(read_answer(reader), 10)
        assert second.status == 400, second.body
        assert await closed(reader) == b""
    finally:
        writer.close()


@pytest.mark.parametrize("request_bytes", [post(GOOD), post(STREAMED), HEALTHZ])
async def test_a_half_closed_client_still_gets_its_answer(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, request_bytes: bytes
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(request_bytes)
        await writer.drain()
        writer.write_eof()  # shutdown(SHUT_WR): nothing more comes, the answer still may
        answer = await asyncio.wait_for(read_answer(reader), 10)
        if request_bytes == post(STREAMED):
            assert answer.status == 200
            assert answer.headers["transfer-encoding"] == "chunked"
            rest = await closed(reader)
            assert b"data: [DONE]" in rest and rest.endswith(b"0\r\n\r\n"), rest[-200:]
        else:
            route = "healthz" if request_bytes == HEALTHZ else "model"
            assert_whole(route, answer.status, answer.body)
            assert await closed(reader) == b""  # then the proxy closes its side too
    finally:
        writer.close()


async def test_a_half_closed_idle_connection_is_closed(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    """Nothing asked, nothing to answer: the proxy closes at once (no fd held)."""
    proxy = await start(start_proxy, tmp_path, sim_server)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(REQUESTS["healthz"])
        await writer.drain()
        answer = await asyncio.wait_for(read_answer(reader), 10)
        assert answer.status == 200
        writer.write_eof()  # after the answer, kept alive and idle: then the client is done
        assert await closed(reader) == b""
    finally:
        writer.close()
