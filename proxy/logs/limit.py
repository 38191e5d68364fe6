"""Warnings that an outage repeats on every request, said once and then summed up.

A store (Redis) that stops answering fails every request's budget charge, lineage, archive
write...: one warning each was thousands of lines an outage (issue 29). `warn_limited` logs
the first warning of a kind at once, then counts the kind's repeats and says them in one line
per `INTERVAL_S` ("... repeated N times in the last 60 s", with the last one's text); a kind
quiet for a whole interval is forgotten, so its next occurrence is logged at once again.

Kinds are fixed strings in the code (never a request's data), so the table stays small.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

INTERVAL_S = 60.0


@dataclass(slots=True)
class _Kind:
    logger: logging.Logger
    interval_s: float
    since: float  # when the current interval began
    loop: asyncio.AbstractEventLoop | None  # the loop its timer is on (one per app run)
    repeats: int = 0  # occurrences not logged in this interval
    last: str = ""  # the latest repeat's message, for the summary
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


_kinds: dict[str, _Kind] = {}


def warn_limited(
    logger: logging.Logger, kind: str, message: str, *args: object, interval_s: float = INTERVAL_S
) -> None:
    """`logger.warning(message, *args)`, unless `kind` was logged less than `interval_s` ago:
    then it is counted, and said with its repeats in one summary line at the interval's end."""
    state = _kinds.get(kind)
    if state is not None and (
        state.loop is not _running_loop() or time.monotonic() - state.since >= state.interval_s
    ):
        _say_repeats(state)  # its timer could not fire (another loop, or none): say it now
        _kinds.pop(kind, None)
        state = None
    if state is not None:
        state.repeats += 1
        state.last = message % args if args else message
        return
    logger.warning(message, *args)
    state = _kinds[kind] = _Kind(logger, interval_s, time.monotonic(), _running_loop())
    _arm(kind, state)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _arm(kind: str, state: _Kind) -> None:
    if state.loop is not None:
        state.timer = state.loop.call_later(state.interval_s, _summarize, kind)


def _summarize(kind: str) -> None:
    """The end of `kind`'s interval: one line for its repeats and a new interval for the next
    ones; or, with none, forget it (its next occurrence is logged at once)."""
    state = _kinds.get(kind)
    if state is None:
        return
    if not _say_repeats(state):
        _kinds.pop(kind, None)
        return
    state.since, state.repeats = time.monotonic(), 0
    _arm(kind, state)


def _say_repeats(state: _Kind) -> bool:
    if state.timer is not None:
        state.timer.cancel()
    if not state.repeats:
        return False
    elapsed = time.monotonic() - state.since
    state.logger.warning(
        "%s (repeated %d times in the last %.0f s)", state.last, state.repeats, elapsed
    )
    return True


def forget() -> None:
    """Start afresh (tests)."""
    for state in _kinds.values():
        if state.timer is not None:
            state.timer.cancel()
    _kinds.clear()
