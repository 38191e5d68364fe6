"""Which sessions this process served lately: what retention needs to know, kept cheaply.

A request notes its session here (a dict update). The store learns of it two ways:
- the first request of a session in this process (a cold one) touches the store before the
  request reads or writes anything: a collection deciding now that the session is old either
  runs before the touch (and then has removed all of it: the request starts afresh) or after
  (and then keeps it) — never half of each;
- later requests are flushed in batches by the collector (proxy/store/collector.py).

A session with a request in flight is active all along (a long stream may still recall what
its request named): every flush reports it, and it is never forgotten.

The warm-turn memos (offload pointers, checkpoints, truncated arguments…) believe the store
holds what they name. So a session idle for half of `live_s` is forgotten here and in them
(`forget`): by the time a collection may evict it (idle for `live_s`), no memo names it and its
next request is cold again. A session is forgotten sooner when `memo_idle_s` says so: memory
then holds the sessions active lately, however many came and went before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from proxy.store.base import StoreError
from proxy.store.retention import Retention

log = logging.getLogger("agentproxy.store")

Forget = Callable[[set[str]], None]
MAX_SESSIONS = 1_000_000  # ~150 bytes each; past it the least recent are forgotten early


class Activity:
    def __init__(
        self,
        retention: Retention,
        forget: Forget,
        *,
        live_s: float,
        memo_idle_s: float = float("inf"),
        max_sessions: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.retention = retention
        self.forget = forget
        self.idle_s = min(live_s / 2, memo_idle_s)
        self.max_sessions = max_sessions
        self.clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()  # least recently seen first
        self._unflushed: dict[str, float] = {}
        self._touching: dict[str, asyncio.Task[None]] = {}  # cold sessions being touched
        self._in_flight: dict[str, int] = {}  # sessions with requests under way: how many

    def __len__(self) -> int:
        return len(self._seen)

    @property
    def in_flight(self) -> int:
        """Sessions with a request under way."""
        return len(self._in_flight)

    def quiet_for(self) -> float:
        """Seconds since the last request ended (0 while one is under way)."""
        if self._in_flight or not self._seen:
            return 0.0
        return self.clock() - next(reversed(self._seen.values()))

    def arrive(self, session: str) -> Awaitable[None] | None:
        """A request of `session` begins (`leave` must follow, whatever happens). For a cold
        session, the touch to await before the request goes on; None (the common case) when
        there is nothing to wait for."""
        now = self.clock()
        seen = self._seen
        self._in_flight[session] = self._in_flight.get(session, 0) + 1
        if session in seen:
            seen.move_to_end(session)
            seen[session] = self._unflushed[session] = now
            touching = self._touching.get(session)  # a request of it arrived just before
            return None if touching is None else asyncio.shield(touching)
        seen[session] = now
        if len(seen) > self.max_sessions:
            self.forget({seen.popitem(last=False)[0]})
        task = self._touching[session] = asyncio.ensure_future(self._touch(session, now))
        task.add_done_callback(lambda _: self._touching.pop(session, None))
        return asyncio.shield(task)  # a request cancelled meanwhile leaves it to the others

    def leave(self, session: str) -> None:
        """A request ended (a long stream counts as activity until its end)."""
        left = self._in_flight.get(session, 1) - 1
        if left > 0:
            self._in_flight[session] = left
        else:
            self._in_flight.pop(session, None)
        if session in self._seen:
            self._seen.move_to_end(session)
            self._seen[session] = self._unflushed[session] = self.clock()

    async def flush(self) -> None:
        """Send the activity noted since the last flush to the store."""
        batch, self._unflushed = self._unflushed, {}
        now = self.clock()
        batch.update((session, now) for session in self._in_flight)
        if batch:
            try:
                await self.retention.touch(batch)
            except StoreError as exc:  # a session only looks older than it is
                log.warning("could not record the activity of %d sessions: %s", len(batch), exc)

    def sweep(self) -> set[str]:
        """Forget sessions idle for idle_s, here and in the memos."""
        now = self.clock()
        cutoff = now - self.idle_s
        seen = self._seen
        idle: set[str] = set()
        while seen:
            session, at = next(iter(seen.items()))
            if at >= cutoff:
                break
            if session in self._in_flight:  # busy all along: seen now
                seen.move_to_end(session)
                seen[session] = now
                continue
            del seen[session]
            self._unflushed.pop(session, None)  # already flushed when it was last seen
            idle.add(session)
        if idle:
            self.forget(idle)
        return idle

    async def _touch(self, session: str, now: float) -> None:
        try:
            await self.retention.touch({session: now})
        except StoreError as exc:  # the store is failing anyway: the request degrades there
            log.debug("could not touch session %s: %s", session, exc)
