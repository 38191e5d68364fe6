"""The app's shutdown, bounded: its closing steps in order, the whole under one deadline.

Each step is awaited in turn (the order matters: the last turns are recorded before the store
closes). A step that overruns (a store that stopped answering mid-close, a task that will not
end) is cancelled with a warning naming it, and a step that fails is logged: either way the
steps after it still run, so the store and the connections are closed and `serve` answers its
SIGTERM in seconds rather than hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

log = logging.getLogger("agentproxy.shutdown")

# The whole close (its steps take milliseconds): within the 10 s the shipped deployments leave
# after the drain (preStop 5 s + drain_s 30 s of terminationGracePeriodSeconds 45).
SHUTDOWN_S = 8.0
STEP_FLOOR_S = 1.0  # a step's allowance when the ones before it spent the deadline

Step = tuple[str, Callable[[], Awaitable[object]]]


async def stop_task(task: asyncio.Task[object] | None) -> None:
    """A background loop of the app's, cancelled and awaited."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def close_in_order(steps: Sequence[Step], within_s: float | None = None) -> list[str]:
    """Run the steps in order within `within_s` (SHUTDOWN_S) in all; the names of those
    that did not finish (overran or failed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (SHUTDOWN_S if within_s is None else within_s)
    unfinished = []
    for name, step in steps:
        allowed = max(deadline - loop.time(), STEP_FLOOR_S)
        running = asyncio.ensure_future(step())
        await asyncio.wait({running}, timeout=allowed)
        if not running.done():
            # Not awaited: a step that swallows its cancel (as wait_for would wait on) must
            # not hold the ones after it.
            running.cancel()
            log.warning("shutdown: %s did not finish within %.1f s; going on", name, allowed)
            unfinished.append(name)
        elif not running.cancelled() and (error := running.exception()) is not None:
            log.warning("shutdown: %s failed; going on", name, exc_info=error)
            unfinished.append(name)
    return unfinished
