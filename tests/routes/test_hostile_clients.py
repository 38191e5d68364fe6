"""Hostile clients over raw sockets (issue 9 §3): deep JSON, key headers that are not UTF-8,
bodies that stop arriving, floods of stalled connections, clients that hang up, and bytes sent
after `Connection: close`. Each gets a clear 4xx (or 503) in OpenAI's shape, nothing is held
without bound, and the proxy serves normally afterwards."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.http.middleware import HANDLING
from proxy.json_values import MAX_JSON_DEPTH, nested_too_deep
from proxy.sim.simulator import Fault, Simulator
from tests.conftest import ProxyFactory, sim_config

KEY = "sk-hostile-good"
ADMIN = "sk-hostile-admin"
GOOD = b'{"model":"sim","messages":[{"role":"user","content":"hi"}]}'
AUTH = f"Authorization: Bearer {KEY}\r\n".encode()


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, server: str = ""
) -> TestServer:
    path = tmp_path / "hostile.yaml"
    extra = f"""
    store: {{path: {tmp_path}}}
    keys:
      admin_key: {ADMIN}
      api_keys: [{{name: good, key: {KEY}}}]
    {server}
    """
    path.write_text(sim_config(str(sim_server.make_url("")).rstrip("/"), extra))
    return await start_proxy(path, watch=False)


@pytest.fixture
async def guarded(start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer) -> TestServer:
    return await start(start_proxy, tmp_path, sim_server)


# --- raw HTTP over asyncio sockets ---------------------------------------------------------------


def post(body: bytes, headers: bytes = AUTH, *, length: int | None = None) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: [::1]\r\nContent-Type: application/json\r\n"
        + headers
        + b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length)
        + body
    )


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def error(self) -> dict[str, Any]:
        """The OpenAI-style error object, checked for shape."""
        error: dict[str, Any] = orjson.loads(self.body)["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str) and error["type"]
        return error


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(int(status_line.split()[1]), headers, body)


async def exchange(server: TestServer, request: bytes) -> Answer:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(read_answer(reader), 10)
    finally:
        writer.close()


async def assert_serves(server: TestServer) -> None:
    answer = await exchange(server, post(GOOD))
    assert answer.status == 200, answer.body


async def metrics_text(server: TestServer) -> str:
    answer = await exchange(server, b"GET /metrics HTTP/1.1\r\nHost: proxy\r\n\r\n")
    return answer.body.decode()


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# --- deep JSON -------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 256, 300, 1024, 1025, 5000])
@pytest.mark.parametrize("where", ["top", "message", "big body"])
async def test_json_nested_too_deep_is_400(guarded: TestServer, depth: int, where: str) -> None:
    """orjson parses 1,024 levels but serializes 254: deeper bodies were a 500 on the way
    upstream (or in the session circuit's signature, inside a message). The limit leaves room."""
    pad = "x" * 20_000 if where == "big body" else ""  # past the cheap bracket count
    if where == "message":  # body, messages, message: 3 levels above the value
        inner = nested(depth - 3)
        body = b'{"model":"sim","messages":[{"role":"user","content":"hi","x":' + inner + b"}]}"
    else:
        inner = nested(depth - 1)
        body = GOOD[:-1] + b',"pad":"' + pad.encode() + b'","x":' + inner + b"}"
    answer = await exchange(guarded, post(body))
    if depth <= MAX_JSON_DEPTH:
        assert answer.status == 200, answer.body
    else:
        assert answer.status == 400, answer.body
        assert f"more than {MAX_JSON_DEPTH} levels deep" in answer.error()["message"]
    await assert_serves(guarded)


@pytest.mark.parametrize("size", ["small", "large"])
def test_depth_check_is_exact_at_the_limit(size: str) -> None:
    """Pins orjson's serialization limit, which the check for larger bodies relies on."""
    pad = b'"' + b"x" * 10_000 + b'",' if size == "large" else b""
    for depth, deep in ((MAX_JSON_DEPTH, False), (MAX_JSON_DEPTH + 1, True)):
        for opening, closing in ((b"[", b"]"), (b'{"a":', b"}")):
            raw = b"[" + pad + opening * (depth - 1) + b"1" * (opening == b'{"a":')
            raw += closing * (depth - 1) + b"]"
            assert nested_too_deep(raw, orjson.loads(raw)) is deep, (depth, opening)
            assert nested_too_deep(raw.decode(), orjson.loads(raw)) is deep


# --- key headers that are not UTF-8 --------------------------------------------------------------

BAD_KEYS = [
    b"x-api-key: \xff\xfe\r\n",
    b"Authorization: Bearer \xff\xfe\r\n",
    b"Authorization: Bearer sk-\xc3\x28\r\n",
]
ROUTES = [
    b"POST /v1/chat/completions",
    b"GET /v1/models",
    b"GET /admin/policies",
    b"POST /admin/reload",
    b"GET /v1/agentproxy/archive/abc",
    b"GET /v1/agentproxy/sessions/s1/archive",
]


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.decode())
@pytest.mark.parametrize("key", BAD_KEYS, ids=["x-api-key", "bearer", "bearer-partial"])
async def test_key_bytes_not_utf8_are_401_on_every_route(
    guarded: TestServer, route: bytes, key: bytes
) -> None:
    head = route + b" HTTP/1.1\r\nHost: proxy\r\n" + key + b"Content-Length: %d\r\n\r\n"
    answer = await exchange(guarded, head % len(GOOD) + GOOD)
    assert answer.status == 401, answer.body
    assert answer.error()["type"] == "authentication_error"
    await assert_serves(guarded)


async def test_policy_header_not_utf8_is_400(guarded: TestServer) -> None:
    """The error message quotes the header: its body must still be valid JSON."""
    answer = await exchange(guarded, post(GOOD, AUTH + b"x-agentproxy-policy: \xff\xfe\r\n"))
    assert answer.status == 400, answer.body
    assert answer.error()["code"] == "policy_not_found"


# --- bodies that stop arriving -------------------------------------------------------------------


async def test_a_body_that_stops_arriving_is_408(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, "server: {body_timeout_s: 0.3}")
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(post(b'{"model":', length=100_000))  # 9 bytes of 100,000, then silence
    await writer.drain()
    answer = await asyncio.wait_for(read_answer(reader), 5)
    assert answer.status == 408
    error = answer.error()
    assert error["code"] == "request_timeout" and "server.body_timeout_s" in error["message"]
    assert await asyncio.wait_for(reader.read(), 5) == b""  # and the connection is closed
    writer.close()
    assert proxy.app[HANDLING].count == 0
    await assert_serves(proxy)


async def test_stalled_connections_are_capped_then_released(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    """300 connections each sending 9 bytes of a 100,000-byte body, against max_in_flight 25:
    25 are held (until body_timeout_s, then 408), the rest are refused at once with 503 and
    Retry-After; health and metrics answer throughout; nothing stays held afterwards."""
    cap, stalled = 25, 300
    settings = f"server: {{body_timeout_s: 1.5, max_in_flight: {cap}}}"
    proxy = await start(start_proxy, tmp_path, sim_server, settings)
    connections = [await asyncio.open_connection("127.0.0.1", proxy.port) for _ in range(stalled)]
    for _, writer in connections:
        writer.write(post(b'{"model":', length=100_000))
    answers: list[Answer] = []

    async def answer_of(reader: asyncio.StreamReader) -> None:
        answers.append(await read_answer(reader))

    waiting = [asyncio.create_task(answer_of(reader)) for reader, _ in connections]
    try:
        await asyncio.sleep(0.7)  # every connection has been seen; the held ones still wait
        refused = [a for a in answers if a.status == 503]
        assert len(refused) == stalled - cap and len(answers) == len(refused)
        assert all(a.headers["retry-after"] == "1" for a in refused)
        assert refused[0].error()["code"] == "overloaded"
        assert proxy.app[HANDLING].count == cap
        health = await exchange(proxy, b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n")
        assert health.status == 200
        assert f"agentproxy_requests_in_flight {cap + 1}.0" in await metrics_text(proxy)
        overloaded = await exchange(proxy, post(GOOD))
        assert overloaded.status == 503
        await asyncio.wait_for(asyncio.gather(*waiting), 10)
    finally:
        for _, writer in connections:
            writer.close()
    assert sorted({a.status for a in answers}) == [408, 503]
    assert sum(a.status == 408 for a in answers) == cap
    assert proxy.app[HANDLING].count == 0
    await assert_serves(proxy)


# --- clients that hang up --------------------------------------------------------------------


def status_counts(metrics: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("agentproxy_requests_total{"):
            status = line.split('status="')[1].split('"')[0]
            counts[status] = counts.get(status, 0) + float(line.rsplit(" ", 1)[1])
    return counts


async def wait_for_status(proxy: TestServer, status: str) -> dict[str, float]:
    for _ in range(100):
        counts = status_counts(await metrics_text(proxy))
        if status in counts:
            return counts
        await asyncio.sleep(0.05)
    raise AssertionError(f"no request was counted with status {status}: {counts}")


async def test_client_leaving_while_its_body_is_read_is_499(
    guarded: TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", guarded.port)
    writer.write(post(b'{"model":', length=100_000))
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()  # hangs up while the proxy waits for the rest of the body
    counts = await wait_for_status(guarded, "499")
    assert not [s for s in counts if s.startswith("5")], counts  # nothing for the 5xx alert
    assert "failed inside the proxy" not in caplog.text
    await assert_serves(guarded)


@pytest.mark.parametrize("stream", [True, False])
async def test_client_leaving_while_its_answer_waits_is_499(
    proxy_for: Any, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    sim = Simulator()
    proxy = await proxy_for(sim)
    sim.inject(Fault(delay_s=0.5))
    body = GOOD[:-1] + (b',"stream":true}' if stream else b"}")
    _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(post(body, b""))
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()  # hangs up while the upstream is still thinking
    await asyncio.sleep(0.5)
    counts = await wait_for_status(proxy, "499")
    assert not [s for s in counts if s.startswith("5")], counts
    assert "failed inside the proxy" not in caplog.text
    answer = await exchange(proxy, post(GOOD, b""))
    assert answer.status == 200


# --- the log stays short ---------------------------------------------------------------------


async def test_bytes_after_connection_close_are_logged_in_one_short_line(
    guarded: TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes after a request that said `Connection: close` are dropped once it is answered;
    garbage after a request is refused (400) once it is answered, and aiohttp's record of it
    (which quotes what the client sent, up to 128 KB) is one short line."""
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    for after in (AUTH + b"Connection: close\r\n", AUTH):
        request = post(GOOD, after) + b"\x01" + b"A" * 200_000 + b"\r\n\r\n"
        reader, writer = await asyncio.open_connection("127.0.0.1", guarded.port)
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(read_answer(reader), 10)
        assert answer.status == 200, answer.body  # the request before the bytes is answered
        rest = await asyncio.wait_for(reader.read(), 10)  # then what aiohttp says, until it closes
        refused = rest.split(b"\r\n", 1)[0].split(b" ")[1:2] == [b"400"]
        assert refused if after == AUTH else rest == b"", rest[:100]
        writer.close()
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert records, "aiohttp said nothing about the malformed request"
    for record in records:
        assert record.levelno <= logging.WARNING and record.exc_info is None
        assert len(caplog.text) < 2000 and len(record.getMessage()) < 300, record.getMessage()
    assert "malformed HTTP request" in records[0].getMessage()
    await assert_serves(guarded)
