"""The bytes of request bodies held at once are bounded, not only their number (issue 29 §7c):
past `server.max_body_bytes_in_flight` a request is refused with 503 and Retry-After in its
own wire format, and what a request held is given back when it ends, however it ends.
Raw sockets against a real proxy."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
from aiohttp.test_utils import TestServer

from proxy.http.body_budget import BODY_BUDGET
from tests.conftest import ProxyFactory
from tests.routes.test_hostile_clients import AUTH, exchange, read_answer, start

BODY_CAP = 1_000_000
BUDGET = 1_500_000  # one large body at a time, and some small ones beside it
SETTINGS = f"server: {{max_body_bytes: {BODY_CAP}, max_body_bytes_in_flight: {BUDGET}}}"


def large(size: int = 900_000) -> bytes:
    head = b'{"model":"sim","messages":[{"role":"user","content":"hi"}],"pad":"'
    return head + b"x" * (size - len(head) - 2) + b'"}'


def head(path: bytes, length: int, extra: bytes = b"") -> bytes:
    return (
        b"POST "
        + path
        + b" HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
        + AUTH
        + extra
        + b"Content-Length: %d\r\n\r\n" % length
    )


async def held(proxy: TestServer, at_least: int) -> None:
    for _ in range(200):
        if proxy.app[BODY_BUDGET].held >= at_least:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the proxy holds {proxy.app[BODY_BUDGET].held} bytes of bodies")


async def released(proxy: TestServer) -> None:
    for _ in range(200):
        if proxy.app[BODY_BUDGET].held == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{proxy.app[BODY_BUDGET].held} bytes of bodies still held")


async def test_a_second_large_body_is_refused_in_its_wire_format_then_served_once_released(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, SETTINGS)
    first = large()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(head(b"/v1/chat/completions", len(first)) + first[:100_000])
    await writer.drain()
    await held(proxy, len(first))  # reserved whole before it is read

    second = large()
    chat = await exchange(proxy, head(b"/v1/chat/completions", len(second)) + second)
    assert chat.status == 503 and chat.headers["retry-after"] == "1"
    assert chat.error()["code"] == "overloaded"
    assert "server.max_body_bytes_in_flight" in chat.error()["message"]
    anthropic_head = head(b"/v1/messages", len(second), b"anthropic-version: 2023-06-01\r\n")
    messages = await exchange(proxy, anthropic_head + second)
    assert messages.status == 503 and messages.headers["retry-after"] == "1"
    envelope = orjson.loads(messages.body)
    assert envelope["type"] == "error" and envelope["error"]["type"] == "overloaded_error"
    responses = await exchange(proxy, head(b"/v1/responses", len(second)) + second)
    assert responses.status == 503 and responses.error()["code"] == "overloaded"
    small = b'{"model":"sim","messages":[{"role":"user","content":"hi"}]}'
    beside = await exchange(proxy, head(b"/v1/chat/completions", len(small)) + small)
    assert beside.status == 200  # the budget left still serves small bodies

    writer.write(first[100_000:])  # the first one finishes, and is served
    await writer.drain()
    answer = await asyncio.wait_for(read_answer(reader), 10)
    writer.close()
    assert answer.status == 200, answer.body
    await released(proxy)
    third = await exchange(proxy, head(b"/v1/chat/completions", len(second)) + second)
    assert third.status == 200, third.body
    await released(proxy)


async def test_a_chunked_body_reserves_as_it_grows(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, SETTINGS)
    first = large()
    _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(head(b"/v1/chat/completions", len(first)) + first[:1000])
    await writer.drain()
    await held(proxy, len(first))
    chunked_head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
        + AUTH
        + b"Transfer-Encoding: chunked\r\n\r\n"
    )
    body = large(800_000)
    chunks = b"".join(
        b"%x\r\n" % len(body[i : i + 65536]) + body[i : i + 65536] + b"\r\n"
        for i in range(0, len(body), 65536)
    )
    refused = await exchange(proxy, chunked_head + chunks + b"0\r\n\r\n")
    assert refused.status == 503 and refused.error()["code"] == "overloaded"
    writer.close()  # the first one hangs up mid-body: what it held comes back
    await released(proxy)
    served = await exchange(proxy, chunked_head + chunks + b"0\r\n\r\n")
    assert served.status == 200, served.body
    await released(proxy)


async def test_clients_hanging_up_mid_body_leak_nothing(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, SETTINGS)
    body = large()
    for _ in range(5):
        _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(head(b"/v1/chat/completions", len(body)) + body[:50_000])
        await writer.drain()
        await held(proxy, len(body))
        writer.close()
        await released(proxy)
    answer = await exchange(proxy, head(b"/v1/chat/completions", len(body)) + body)
    assert answer.status == 200, answer.body
