"""Starting a coroutine in the caller's task, without a task of its own.

Settling a request (flow.finish) against in-process state never waits on anything: as a task
(asyncio.shield) it cost a Task, a future and a turn of the event loop per request. `start`
runs it at once instead; should it wait after all, what is left goes on in a task from where it
stopped. Only for coroutines that enter no `asyncio.timeout` (or other context bound to the
current task) before their first wait: the rest of them runs in another task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def start(coro: Coroutine[Any, Any, None]) -> asyncio.Future[None] | None:
    """Run `coro` up to its first wait: None when it finished without one (its exception, if
    it raised, propagates), else a task running the rest."""
    try:
        waiting = coro.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_resume(coro, waiting))


async def _resume(coro: Coroutine[Any, Any, None], waiting: Any) -> None:
    """Drive `coro`, stopped on `waiting` (what it yielded), as its own task would: wait for
    that future (a bare yield is a turn of the loop), then resume it, with the outcome."""
    while True:
        try:
            if waiting is None:
                await asyncio.sleep(0)
            else:  # taken over as a task takes what it is given, or awaiting it refuses
                waiting._asyncio_future_blocking = False
                await waiting
        except BaseException as exc:  # the future failed (or this task was cancelled)
            try:
                waiting = coro.throw(exc)
            except StopIteration:
                return
            continue
        try:
            waiting = coro.send(None)
        except StopIteration:
            return
