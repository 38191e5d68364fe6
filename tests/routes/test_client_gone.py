"""A client that hangs up: the upstream call it was waiting on is closed at once (not read to
its end), and what that call used is still charged, to the tokens metric and to budgets."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import ProxyFactory
from tests.upstream.hostile import (
    COMPLETION_HEAD,
    HostileFactory,
    HostileProxy,
    Witness,
    content_event,
    endless,
    hostile_proxy_factory,
    send,
    sse_events,
)

BUDGETED = """
policies:
  - name: metered
    budgets:
      - {name: spend, limits: {tokens: 1000000}}
"""
PROMPT = "count to a million, slowly " * 40  # ~1 KB: an estimate of ~270 prompt tokens


@pytest.fixture
def hostile(aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path) -> HostileFactory:
    return hostile_proxy_factory(aiohttp_server, start_proxy, tmp_path)


def endless_stream(pause_s: float = 0.01) -> Any:
    """Token after token, forever; the usage chunk (which comes last) never does."""

    async def behave(response: web.StreamResponse, witness: Witness) -> None:
        number = 0
        while True:
            await send(response, witness, sse_events(content_event(f"t{number}")))
            number += 1
            await asyncio.sleep(pause_s)

    return behave


def stalled_stream() -> Any:
    """Two events, then silence (a model thinking), well within read_timeout_s."""

    async def behave(response: web.StreamResponse, witness: Witness) -> None:
        await send(response, witness, sse_events(content_event("a"), content_event("b")))
        await asyncio.sleep(60)

    return behave


async def leave_after(served: HostileProxy, stream: bool, *, events: int = 0) -> None:
    """Send a request, read `events` events (or wait 0.3 s), and hang up."""
    body = {"model": "sim", "stream": stream, "messages": [{"role": "user", "content": PROMPT}]}
    async with aiohttp.ClientSession() as http:
        if not stream:  # no answer comes before the whole body: give up waiting for it
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(http.post(served.chat_url, json=body), 0.3)
            return
        response = await http.post(served.chat_url, json=body)
        assert response.status == 200
        for _ in range(events):
            assert (await response.content.readuntil(b"\n\n")).startswith(b"data: ")
        response.close()


async def wait_charged(served: HostileProxy, kind: str) -> float:
    async with aiohttp.ClientSession() as http:
        for _ in range(100):
            tokens = await served.metric(http, "agentproxy_tokens_total", model="sim", kind=kind)
            if tokens:
                return tokens
            await asyncio.sleep(0.02)
        return 0.0


async def test_a_client_leaving_a_stream_closes_the_upstream_and_is_charged(
    hostile: HostileFactory,
) -> None:
    served = await hostile(endless_stream(), "text/event-stream", extra=BUDGETED)
    await leave_after(served, stream=True, events=5)
    await asyncio.wait_for(served.witness.hung_up.wait(), 2)
    assert await wait_charged(served, "prompt") >= 200  # the prompt's estimate
    assert await wait_charged(served, "completion") >= 5  # at least the events relayed
    async with aiohttp.ClientSession() as http:
        used = await served.metric(
            http, "agentproxy_budget_used_ratio", budget="spend", limit="tokens"
        )
    assert used > 0  # and the budget was charged


async def test_a_client_leaving_a_silent_stream_closes_the_upstream(
    hostile: HostileFactory,
) -> None:
    served = await hostile(stalled_stream(), "text/event-stream")
    await leave_after(served, stream=True, events=2)
    await asyncio.wait_for(served.witness.hung_up.wait(), 2)
    assert await wait_charged(served, "prompt") > 0


async def test_a_client_leaving_an_endless_body_stops_the_proxy_reading_and_is_charged(
    hostile: HostileFactory,
) -> None:
    """64 KiB every 10 ms: the 64 MiB cap is 10 s away, so only the client's leaving can stop
    the read within the two seconds allowed."""
    served = await hostile(endless(COMPLETION_HEAD, b"a" * 65536, pause_s=0.01), extra=BUDGETED)
    await leave_after(served, stream=False)
    await asyncio.wait_for(served.witness.hung_up.wait(), 2)
    sent = served.witness.sent
    await asyncio.sleep(0.2)
    assert served.witness.sent == sent  # nothing more read
    assert await wait_charged(served, "prompt") >= 200
