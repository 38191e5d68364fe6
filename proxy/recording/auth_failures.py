"""Refused admin callers, audited without crowding out the audit or the log.

One `admin.auth_failed` entry (and log line) per refusal let anyone who reaches the port push
every genuine entry out of the audit, which keeps the latest 100,000. So refusals are audited
in windows: a window opens at a refusal and lasts WINDOW_S. In it, an address's first
RECORDED_PER_ADDRESS refusals are entries of their own while the window's RECORDED_PER_WINDOW
and the day's RECORDED_PER_DAY (all addresses) last; the others are counted, not written. When
the window ends (its timer, the next refusal after it, or the proxy stopping), each address
with refusals not written gets one entry with `suppressed` (how many) and `window`: the
SUMMARIES_PER_WINDOW addresses with most, while the day's entries last; the rest, and the
addresses past MAX_ADDRESSES, are one entry with `from` null, `addresses` and their sum.

Every refusal is counted in `agentproxy_admin_auth_failures_total` (`audit`: recorded or
coalesced). Windows are this process's: each replica coalesces its own refusals.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from dataclasses import dataclass
from typing import Any

from proxy.metrics import Metrics
from proxy.recording.audit import Audit

WINDOW_S = 60.0
# A person mistyping or a client holding an old key is seen in full; a guesser is summed up.
RECORDED_PER_ADDRESS = 5
# All addresses together: an IPv6 /64 is billions of addresses, one caller's.
RECORDED_PER_WINDOW = 30
# Addresses summed up one entry each when a window ends (the most refused); the others: one.
SUMMARIES_PER_WINDOW = 10
# Entries a day (own and per-address summaries); past it, one summary a window for all. The
# worst a flood can write a day: 3,000 + 1,440 windows = 4,440 entries, ~31,000 in the default
# retention (7 days): under a third of the audit's 100,000.
RECORDED_PER_DAY = 3000
DAY_S = 86400.0
# Addresses tracked in a window (~200 bytes each, ~2 MB at most); refusals of the ones past
# it are counted in the summary for all.
MAX_ADDRESSES = 10_000


@dataclass(slots=True)
class _Address:
    refused: int = 0  # in this window
    suppressed: int = 0  # of them, not written


class AuthFailures:
    """`admin.auth_failed` entries, coalesced past the limits above (one per app)."""

    def __init__(self, audit: Audit, metrics: Metrics) -> None:
        self._audit = audit
        self._recorded = metrics.admin_auth_failures.labels("recorded")
        self._coalesced = metrics.admin_auth_failures.labels("coalesced")
        self._started: float | None = None  # the open window's start (Unix time)
        self._addresses: dict[str, _Address] = {}
        self._untracked = 0  # refusals of addresses past MAX_ADDRESSES, this window
        self._written = 0  # entries of their own, this window
        self._day = -1
        self._day_written = 0  # entries of their own and per-address summaries, that day
        self._timer: asyncio.TimerHandle | None = None

    async def refused(self, remote: str | None, **details: Any) -> None:
        """A refusal from `remote`: written at once (`details` are its fields), or counted."""
        now = time.time()
        if self._started is not None and now >= self._started + WINDOW_S:
            self._end_window()
        if self._started is None:
            self._started = now
        self._roll_day(now)
        seen = self._addresses.get(remote or "")
        if seen is None:
            if len(self._addresses) >= MAX_ADDRESSES:
                self._untracked += 1
                self._suppress()
                return
            seen = self._addresses[remote or ""] = _Address()
        seen.refused += 1
        if (
            seen.refused <= RECORDED_PER_ADDRESS
            and self._written < RECORDED_PER_WINDOW
            and self._day_written < RECORDED_PER_DAY
        ):
            self._written += 1
            self._day_written += 1
            self._recorded.inc()
            await self._audit.record("admin.auth_failed", "unknown", remote, **details)
            return
        seen.suppressed += 1
        self._suppress()

    def close(self) -> None:
        """The open window's summaries on their way (the proxy stops); `Audit.settled` waits."""
        self._end_window()

    def _suppress(self) -> None:
        self._coalesced.inc()
        if self._timer is None and self._started is not None:  # its summary, when it ends
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(
                max(0.0, self._started + WINDOW_S - time.time()), self._end_window
            )

    def _roll_day(self, now: float) -> None:
        day = int(now // DAY_S)
        if day != self._day:
            self._day, self._day_written = day, 0

    def _end_window(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        started, addresses, untracked = self._started, self._addresses, self._untracked
        self._started, self._addresses, self._untracked, self._written = None, {}, 0, 0
        if started is None:
            return
        window = {"start": round(started, 3), "end": round(started + WINDOW_S, 3)}
        self._roll_day(time.time())
        heavy = [(s.suppressed, a) for a, s in addresses.items() if s.suppressed]
        room = max(0, min(SUMMARIES_PER_WINDOW, RECORDED_PER_DAY - self._day_written))
        summed = heapq.nlargest(room, heavy)
        for suppressed, address in summed:
            self._day_written += 1
            self._summary(address or None, suppressed, window)
        rest_suppressed = sum(n for n, _ in heavy) - sum(n for n, _ in summed) + untracked
        if rest_suppressed:  # the others, one entry
            self._summary(None, rest_suppressed, window, addresses=len(heavy) - len(summed))

    def _summary(self, remote: str | None, suppressed: int, window: Any, **more: Any) -> None:
        self._audit.soon(
            "admin.auth_failed", "unknown", remote, suppressed=suppressed, window=window, **more
        )
