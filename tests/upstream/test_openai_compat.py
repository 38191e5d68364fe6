"""What the fast path reads from an upstream is bounded in size and time, over real sockets,
against hostile upstreams: an endless body, a 100 MB body, an event that never ends, a drip.

The proxy and its upstream run in this process, so its RSS growth bounds the proxy's."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.conftest import ProxyFactory
from tests.upstream.hostile import (
    COMPLETION_HEAD,
    COMPLETION_TAIL,
    DELTA,
    ENDLESS,
    HostileFactory,
    MiB,
    content_event,
    endless,
    hostile_proxy_factory,
    json_body,
    json_size,
    peak_rss,
    send,
    sse_events,
)

RSS_CEILING_MB = 150  # for bodies of 100-400 MB refused at a 64 MiB (or 8 MiB) cap
ONE_ATTEMPT = """
policies:
  - name: one-attempt
    retry: {attempts: 1}
"""
ASK = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def hostile(aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path) -> HostileFactory:
    return hostile_proxy_factory(aiohttp_server, start_proxy, tmp_path)


async def post(url: str, stream: bool = False) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.post(url, json={**ASK, "stream": stream}) as response,
    ):
        return response.status, await response.read()


def error_of(raw: bytes) -> dict[str, Any]:
    error: dict[str, Any] = orjson.loads(raw)["error"]
    return error


async def test_an_endless_body_is_refused_at_the_cap_in_bounded_memory(
    hostile: HostileFactory,
) -> None:
    served = await hostile(endless(COMPLETION_HEAD, b"a" * MiB))
    with peak_rss() as rss:
        status, raw = await post(served.chat_url)
    assert status == 502, raw
    error = error_of(raw)
    assert error["code"] == "upstream_bad_response"
    assert "server.max_response_bytes (64 MiB)" in error["message"]
    assert rss.growth_mb < RSS_CEILING_MB, f"RSS grew {rss.growth_mb:.0f} MB"
    await asyncio.wait_for(served.witness.hung_up.wait(), 2)  # closed, not drained
    assert served.witness.sent < ENDLESS // 4
    assert served.witness.requests == 1  # the same request would draw the same: no retry


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_a_100_mb_json_body_is_refused_in_bounded_memory(
    hostile: HostileFactory, declared: bool
) -> None:
    size = 100 * 1000 * 1000
    served = await hostile(json_body(size), length=json_size(size) if declared else None)
    with peak_rss() as rss:
        status, raw = await post(served.chat_url)
    assert status == 502 and error_of(raw)["code"] == "upstream_bad_response"
    assert "raise server.max_response_bytes" in error_of(raw)["message"]
    assert rss.growth_mb < RSS_CEILING_MB, f"RSS grew {rss.growth_mb:.0f} MB"
    await asyncio.wait_for(served.witness.hung_up.wait(), 2)
    if declared:  # refused on its Content-Length: hardly a byte of it was read
        assert served.witness.sent < 32 * MiB


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_a_body_at_the_cap_passes_whole_and_one_byte_more_is_refused(
    hostile: HostileFactory, declared: bool
) -> None:
    cap = 65536
    extra = f"server: {{max_response_bytes: {cap}}}\n"
    content = cap - json_size(0)
    at_cap = await hostile(json_body(content), length=cap if declared else None, extra=extra)
    status, raw = await post(at_cap.chat_url)
    assert status == 200 and len(raw) == cap
    assert raw == COMPLETION_HEAD + b"a" * content + COMPLETION_TAIL  # byte-identical
    over = await hostile(json_body(content + 1), length=cap + 1 if declared else None, extra=extra)
    status, raw = await post(over.chat_url)
    assert status == 502
    assert "server.max_response_bytes (65536 bytes)" in error_of(raw)["message"]


async def test_an_event_that_never_ends_is_refused_quickly_in_bounded_memory(
    hostile: HostileFactory,
) -> None:
    served = await hostile(
        endless(b"data: " + DELTA + b'{"content":"', b"a" * 65536), "text/event-stream"
    )
    started = time.monotonic()
    with peak_rss() as rss:
        status, raw = await post(served.chat_url, stream=True)
    elapsed = time.monotonic() - started
    assert status == 502, raw
    error = error_of(raw)
    assert error["code"] == "upstream_bad_response"
    assert "server.max_event_bytes (8 MiB)" in error["message"]
    assert elapsed < 5, f"{elapsed:.1f}s to refuse an 8 MiB event: not linear"
    assert rss.growth_mb < RSS_CEILING_MB, f"RSS grew {rss.growth_mb:.0f} MB"
    await asyncio.wait_for(served.witness.hung_up.wait(), 2)
    assert served.witness.requests == 1


async def test_an_event_too_large_mid_stream_ends_it_with_an_error_event(
    hostile: HostileFactory,
) -> None:
    start = sse_events(content_event("one"), content_event("two"), content_event("three"))
    served = await hostile(
        endless(start + b"data: " + DELTA + b'{"content":"', b"b" * 65536),
        "text/event-stream",
        extra="server: {max_event_bytes: 1048576}\n",
    )
    status, raw = await post(served.chat_url, stream=True)
    assert status == 200, raw  # the stream had begun
    text = raw.decode()
    assert '"content":"one"' in text and '"content":"three"' in text
    last = text.strip().split("\n\n")[-1]
    assert last.startswith("data: ")
    error = orjson.loads(last[6:])["error"]
    assert error["code"] == "upstream_bad_response"
    assert "server.max_event_bytes (1 MiB)" in error["message"]
    await asyncio.wait_for(served.witness.hung_up.wait(), 2)


async def test_a_dripping_body_is_cut_at_the_response_timeout(hostile: HostileFactory) -> None:
    """A byte every 50 ms: never silent long enough for read_timeout_s to fire."""
    served = await hostile(
        endless(COMPLETION_HEAD, b"a", pause_s=0.05),
        extra="server: {response_timeout_s: 1}\n" + ONE_ATTEMPT,
    )
    started = time.monotonic()
    status, raw = await post(served.chat_url)
    elapsed = time.monotonic() - started
    assert status == 504, raw
    error = error_of(raw)
    assert error["code"] == "upstream_timeout"
    assert "within 1s; raise server.response_timeout_s" in error["message"]
    assert 0.9 < elapsed < 3
    await asyncio.wait_for(served.witness.hung_up.wait(), 2)


async def test_a_stream_in_tiny_crlf_pieces_is_relayed_event_by_event(
    hostile: HostileFactory,
) -> None:
    """Separators split across reads, CRLF line ends: each event arrives whole and once."""
    words = [f"w{i}" for i in range(40)]
    body = sse_events(*(content_event(w) for w in words), b"[DONE]").replace(b"\n", b"\r\n")

    async def in_pieces(response: web.StreamResponse, witness: Any) -> None:
        for offset in range(0, len(body), 7):
            await send(response, witness, body[offset : offset + 7])
            await asyncio.sleep(0)

    served = await hostile(in_pieces, "text/event-stream")
    status, raw = await post(served.chat_url, stream=True)
    assert status == 200
    events = raw.decode().strip().split("\n\n")
    assert events[-1] == "data: [DONE]"
    got = [orjson.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:-1]]
    assert got == words


async def test_an_error_body_in_pieces_passes_through_whole(hostile: HostileFactory) -> None:
    said = orjson.dumps(
        {"error": {"message": "bad request " + "x" * 3000, "type": "invalid_request_error"}}
    )

    async def error_in_pieces(response: web.StreamResponse, witness: Any) -> None:
        for offset in range(0, len(said), 1000):
            await send(response, witness, said[offset : offset + 1000])
            await asyncio.sleep(0.01)

    served = await hostile(error_in_pieces, status=400)
    status, raw = await post(served.chat_url)
    assert status == 400 and raw == said
