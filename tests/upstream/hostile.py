"""Hostile upstreams: real aiohttp servers on loopback that answer 200 and then misbehave (an
endless body, a 100 MB body, an event that never ends, a drip), and report what they saw, and
a proxy in front of one. Shared by tests/upstream and tests/routes."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory, sim_config

MiB = 1024 * 1024
COMPLETION_HEAD = (
    b'{"id":"chatcmpl-h","object":"chat.completion","created":0,"model":"sim","choices":'
    b'[{"index":0,"message":{"role":"assistant","content":"'
)
COMPLETION_TAIL = b'"},"finish_reason":"stop"}]}'
DELTA = b'{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":'


@dataclass
class Witness:
    """What a hostile upstream saw: requests, bytes sent, and when a handler stopped because
    the proxy closed the connection (its write failed, or the server cancelled it)."""

    requests: int = 0
    sent: int = 0
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)
    hung_up_at: float | None = None

    def stopped(self) -> None:
        if self.hung_up_at is None:
            self.hung_up_at = time.monotonic()
        self.hung_up.set()


Behaviour = Callable[[web.StreamResponse, Witness], Awaitable[None]]


def hostile_app(
    behaviour: Behaviour, content_type: str, length: int | None = None, status: int = 200
) -> Any:
    witness = Witness()

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        witness.requests += 1
        response = web.StreamResponse(status=status, headers={"Content-Type": content_type})
        if length is not None:
            response.content_length = length
        await response.prepare(request)
        try:
            await behaviour(response, witness)
        except (ConnectionError, asyncio.CancelledError):
            witness.stopped()
            raise
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    return app, witness


async def send(response: web.StreamResponse, witness: Witness, data: bytes) -> None:
    await response.write(data)
    witness.sent += len(data)


ENDLESS = 400 * MiB  # "endless" stops here, so a proxy without bounds fails, not the machine


def endless(head: bytes, filler: bytes, pause_s: float = 0.0) -> Behaviour:
    """`head`, then `filler` again and again until the proxy hangs up (or ENDLESS is sent)."""

    async def behave(response: web.StreamResponse, witness: Witness) -> None:
        await send(response, witness, head)
        while witness.sent < ENDLESS:
            await send(response, witness, filler)
            await asyncio.sleep(pause_s)

    return behave


def json_body(content_bytes: int) -> Behaviour:
    """A valid chat completion whose content is `content_bytes` long, sent in 1 MiB writes."""

    async def behave(response: web.StreamResponse, witness: Witness) -> None:
        await send(response, witness, COMPLETION_HEAD)
        left = content_bytes
        while left:
            piece = min(left, MiB)
            await send(response, witness, b"a" * piece)
            left -= piece
        await send(response, witness, COMPLETION_TAIL)

    return behave


def json_size(content_bytes: int) -> int:
    return len(COMPLETION_HEAD) + content_bytes + len(COMPLETION_TAIL)


def sse_events(*events: bytes) -> bytes:
    return b"".join(b"data: " + event + b"\n\n" for event in events)


def content_event(text: str) -> bytes:
    return DELTA + b'{"content":"' + text.encode() + b'"},"finish_reason":null}]}'


@dataclass
class HostileProxy:
    proxy: TestServer
    witness: Witness

    @property
    def chat_url(self) -> str:
        return str(self.proxy.make_url("/v1/chat/completions"))

    async def metric(self, http: Any, name: str, **labels: str) -> float:
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        async with http.get(str(self.proxy.make_url("/metrics"))) as response:
            text = await response.text()
        for line in text.splitlines():
            if line.startswith(name + "{") and " " in line:
                got, value = line.rsplit(" ", 1)
                inside = got[len(name) + 1 : -1]
                if ",".join(sorted(inside.split(","))) == wanted:
                    return float(value)
        return 0.0


HostileFactory = Callable[..., Awaitable[HostileProxy]]


def hostile_proxy_factory(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> HostileFactory:
    async def start(
        behaviour: Behaviour,
        content_type: str = "application/json",
        *,
        length: int | None = None,
        status: int = 200,
        extra: str = "",
    ) -> HostileProxy:
        app, witness = hostile_app(behaviour, content_type, length, status)
        upstream = await aiohttp_server(app)
        # One file per proxy: a proxy watches its file, and a second proxy must not edit it.
        path = tmp_path / f"hostile-{uuid.uuid4().hex[:8]}.yaml"
        url = str(upstream.make_url("")).rstrip("/")
        path.write_text(sim_config(url, f"store: {{path: {tmp_path}}}\n{extra}"))
        return HostileProxy(await start_proxy(path), witness)

    return start


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Peak:
    start: int
    peak: int = 0

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.start) / 1e6


@contextmanager
def peak_rss() -> Iterator[Peak]:
    """This process's peak RSS while the block runs (the proxy and its upstream run in it),
    sampled every 5 ms by a thread, so a busy event loop cannot hide a peak."""
    peak = Peak(rss_bytes())
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak.peak = max(peak.peak, rss_bytes())
            done.wait(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()
        peak.peak = max(peak.peak, rss_bytes())
