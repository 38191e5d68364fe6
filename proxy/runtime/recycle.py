"""When a worker hands over to a fresh one: its resident memory past `server.max_rss_mb`.

Under sustained heavy load the C heap fragments (docs/operations.md#memory): free space
between live chunks that no trim can return, a few MB a minute at 200 requests a second. A
fresh process starts without it. So a worker past the ceiling leaves as on SIGTERM (stops
accepting, drains, writes its guard state: proxy/runtime/handover.py) and exits with
RECYCLE_EXIT; the parent holding the port forks its successor (proxy/runtime/workers.py), and the
connections that arrive meanwhile wait in the port's backlog.

The ceiling is soft: RSS is read every CHECK_EVERY_S, so it can pass the ceiling by what the
requests in flight allocate within one check, and the old worker still answers the kept-alive
connections while it drains. A second, hard ceiling (HARD_FACTOR times it) bounds the drain:
past it the leaving worker admits no new request (a 503 `overloaded` in the client's wire
format, its connection closed: a retry reaches the successor) and only finishes those in
flight (docs/operations.md#memory).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger("agentproxy")

RECYCLE_EXIT = 75  # EX_TEMPFAIL: "replace me", not a failure
CHECK_EVERY_S = 1.0  # reading /proc/self/statm costs a few µs
HARD_FACTOR = 1.25  # the hard ceiling, over max_rss_mb: what a draining worker may reach
YOUNG_S = 60.0  # a worker replaced sooner than this is told its ceiling is too low

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_mb() -> float | None:
    """This process's resident memory in MiB (Linux), or None where /proc has no statm."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return None


async def watch_rss(max_rss_mb: int, past: Callable[[], None]) -> None:
    """Call `past` once this process's resident memory exceeds `max_rss_mb`."""
    started = time.monotonic()
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        rss = resident_mb()
        if rss is None:
            log.warning("server.max_rss_mb: this system does not show a process's resident "
                        "memory (/proc/self/statm); workers will not be recycled")  # fmt: skip
            return
        if rss > max_rss_mb:
            lived = time.monotonic() - started
            log.warning(
                "resident memory %.0f MB is past server.max_rss_mb (%d): handing over to a "
                "fresh worker after %.0f s",
                rss, max_rss_mb, lived,
            )  # fmt: skip
            if lived < YOUNG_S:
                log.warning("a worker needed replacing within %.0f s of its start: "
                            "server.max_rss_mb (%d) is too low for this load", lived,
                            max_rss_mb)  # fmt: skip
            past()
            return


def hard_ceiling_mb(max_rss_mb: int) -> float:
    return max_rss_mb * HARD_FACTOR


async def refuse_past_hard_ceiling(max_rss_mb: int, refuse: Callable[[bool], None]) -> None:
    """While a worker that left drains: `refuse(True)` whenever its resident memory is past
    the hard ceiling (new requests are then refused), `refuse(False)` once back under it."""
    hard = hard_ceiling_mb(max_rss_mb)
    refusing = False
    while True:
        rss = resident_mb()
        if rss is None:
            return
        if (rss > hard) != refusing:
            refusing = rss > hard
            refuse(refusing)
            if refusing:
                log.warning("resident memory %.0f MB is past the hard ceiling (%.0f MB, %g x "
                            "server.max_rss_mb): this worker admits no new request while it "
                            "drains", rss, hard, HARD_FACTOR)  # fmt: skip
        await asyncio.sleep(CHECK_EVERY_S)
