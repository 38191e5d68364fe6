"""Run the application on a port until SIGTERM or SIGINT, then drain and exit.

On the signal the listening socket closes at once (new connections are refused; a load
balancer's readiness check fails over) and requests in flight, streams included, get up to
`server.drain_s` to finish. Kept-alive connections stay open meanwhile: a request that arrives
on one is answered, with `Connection: close`, so that no client sends on a connection as it is
closed; once nothing is in flight and no request has begun for half a second, the idle ones
close. Past the deadline the rest are cancelled (a stream's client sees it end), the
application's clean-up runs (the store's last activity flushed, connections closed), and the
process exits 0.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import logging
import signal
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web

from proxy.http.middleware import HANDLING, Handling
from proxy.runtime.handover import HANDOVER
from proxy.runtime.head_deadline import ProxyRunner
from proxy.runtime.listen import start_site
from proxy.runtime.recycle import refuse_past_hard_ceiling, watch_rss

log = logging.getLogger("agentproxy")
T = TypeVar("T")

QUIET_S = 0.5  # a drain ends once no request has begun for this long (and none is in flight)
POLL_S = 0.02
CHOOSE_PORT = "pick another with --port N (or server.port in the configuration)"
CANCEL_S = 0.25  # past the deadline: what is still in flight is cancelled, and given this to end


async def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    drain_s: float,
    ready: Callable[[], None] = lambda: None,
    leaving: Callable[[], None] = lambda: None,
    sock: socket.socket | None = None,
    max_rss_mb: int | None = None,
) -> bool:
    """Serve until SIGTERM/SIGINT; `ready` is called once listening. Start-up failures (an
    unwritable store) raise before anything listens. `sock`: an already bound socket to
    serve on instead of host and port. A worker that a parent replaces (the app built with
    `handover`) also leaves on SIGUSR1 or past `max_rss_mb` of resident memory: it stops
    accepting, hands its guard state over, calls `leaving` (the parent forks its successor
    then) and drains; True when it left for that reason (proxy/runtime/recycle.py)."""
    runner = ProxyRunner(app, handle_signals=False, shutdown_timeout=CANCEL_S)
    await runner.setup()
    stopping = time.monotonic()
    try:
        site: web.BaseSite
        if sock:
            site = web.SockSite(runner, sock)
            await site.start()
        else:  # a taken port is one line (ListenError), not the bind's traceback
            site = web.TCPSite(runner, host, port)
            await start_site(site, host, port, CHOOSE_PORT)
        freeze_heap()
        ready()
        kind = type(asyncio.get_running_loop()).__module__.partition(".")[0]  # uvloop, asyncio
        log.info("serving on the %s event loop", kind)
        handover = app[HANDOVER]
        recycling = await _until_stopped(max_rss_mb if handover.enabled else None,
                                         recyclable=handover.enabled)  # fmt: skip
        stopping = time.monotonic()
        await site.stop()  # no new connections here (a parent's copy of the socket queues them)
        if recycling:
            if left := handover.leave():
                log.info("left %d guard state entries for the next worker", left)
            leaving()
        log.info(
            "stopping%s: no new connections; %d request(s) in flight get up to %gs to finish",
            " for a fresh worker" if handover.due else "", app[HANDLING].count, drain_s,
        )  # fmt: skip
        assert runner.server is not None
        handling = app[HANDLING]
        guard = None
        if recycling and max_rss_mb is not None:  # the drain, bounded by the hard ceiling
            guard = asyncio.create_task(refuse_past_hard_ceiling(
                max_rss_mb, lambda full: setattr(handling, "memory_full", full)))  # fmt: skip
        try:
            await _drain(runner.server, handling, drain_s)
        finally:
            if guard is not None:
                guard.cancel()
    finally:
        await runner.cleanup()
    log.info("stopped after draining for %.1fs", time.monotonic() - stopping)
    return handover.due


async def _drain(server: web.Server, handling: Handling, drain_s: float) -> None:
    """Let the connections open now finish, for up to `drain_s`: the requests in flight
    (streams too) complete, and each answer from now on closes its connection (a kept-alive
    client takes a new one, served elsewhere), so no client sends on a connection being
    closed. Done once no request is in flight and none has begun for QUIET_S; the
    connections still open then are idle, and close."""
    handling.draining = True
    began = time.perf_counter()
    deadline = began + drain_s
    while server.connections and (now := time.perf_counter()) < deadline:
        if handling.count == 0 and now - max(began, handling.last_started) >= QUIET_S:
            return
        await asyncio.sleep(POLL_S)


def freeze_heap() -> None:
    """What start-up built lives as long as the process: out of the collector's sight, the
    full collections that requests trigger no longer walk it again (~5% of a request's CPU;
    with litellm imported, ~200 ms a collection). Forked workers share it untouched, too."""
    gc.freeze()


def loop_unavailable(event_loop: str) -> str | None:
    """Why `server.event_loop` cannot be had here (checked before serving), or None."""
    if event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        return (
            "server.event_loop is uvloop, which is not installed: "
            "pip install 'agentproxy[speed]' (or set event_loop: auto)"
        )
    return None


def run(main: Coroutine[Any, Any, T], event_loop: str) -> T:
    """`asyncio.run(main)` on the event loop `server.event_loop` asks for: uvloop (`auto`
    takes it when installed: `pip install 'agentproxy[speed]'`), else asyncio's own."""
    if event_loop != "asyncio" and importlib.util.find_spec("uvloop") is not None:
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


async def _until_stopped(max_rss_mb: int | None, recyclable: bool) -> bool:
    """Wait for SIGTERM/SIGINT (False) or, when `recyclable`, for SIGUSR1 or resident memory
    past `max_rss_mb` (True: hand over to a fresh worker)."""
    loop = asyncio.get_running_loop()
    left: asyncio.Future[bool] = loop.create_future()

    def leave(recycle: bool) -> None:
        if not left.done():
            left.set_result(recycle)

    signals = {signal.SIGTERM: False, signal.SIGINT: False}
    if recyclable:
        signals[signal.SIGUSR1] = True
    for sig, recycle in signals.items():
        loop.add_signal_handler(sig, leave, recycle)
    watcher = asyncio.create_task(watch_rss(max_rss_mb, lambda: leave(True))) if (
        max_rss_mb is not None
    ) else None  # fmt: skip
    try:
        recycle = await left
    finally:
        if watcher is not None:
            watcher.cancel()
        for sig in signals:
            loop.remove_signal_handler(sig)
    if recycle:  # the parent's SIGTERM must not cut the drain short, nor the hand-over after
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
    return recycle
