"""Whether the store takes writes: checked at start-up (refuse to start) and by /readyz.

A store that cannot be written turns every offload and archive into a no-op, so a request that
needed one overflows at the provider instead: that is a proxy that is not ready, not a healthy
one. The check is a real small write; /readyz is unauthenticated, so however often it is asked
the store sees at most one check per `every_s`, and one that hangs is cut off at `timeout_s`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from proxy.redaction import redact_urls_in
from proxy.store.base import Store, StoreError

RETRY_EVERY_S = 0.25  # while start-up waits for the store


@dataclass(frozen=True, slots=True)
class StoreStatus:
    backend: str
    problem: str | None  # None: writable

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"backend": self.backend, "writable": self.problem is None}
        if self.problem is not None:
            out["error"] = self.problem
        return out


class StoreHealth:
    def __init__(
        self,
        store: Store,
        backend: str,
        *,
        every_s: float = 1.0,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.backend = backend
        self.every_s = every_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._last: tuple[float, StoreStatus] | None = None
        self._lock = asyncio.Lock()  # concurrent askers share one check

    async def status(self) -> StoreStatus:
        async with self._lock:
            if self._last is not None and self.clock() - self._last[0] < self.every_s:
                return self._last[1]
            status = StoreStatus(self.backend, await self._problem())
            self._last = (self.clock(), status)
            return status

    async def require_writable(self, wait_s: float = 0.0) -> None:
        """At start-up: a StoreError that says what to fix, unless the store takes a write
        within `wait_s` (a Redis started alongside the proxy may take a moment to answer)."""
        give_up = self.clock() + wait_s
        problem = await self._problem()
        for _ in range(math.ceil(wait_s / RETRY_EVERY_S)):
            if problem is None or self.clock() >= give_up:
                break
            await asyncio.sleep(RETRY_EVERY_S)
            problem = await self._problem()
        if problem is not None:
            raise StoreError(
                f"the store (store.backend: {self.backend}) is not writable: {problem}; "
                "offloading and archiving need it: fix it, or point store.path / store.url "
                "at one that is"
            )

    async def _problem(self) -> str | None:
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.store.probe()
        except TimeoutError:
            return f"a write did not finish within {self.timeout_s:g}s"
        except StoreError as exc:
            return redact_urls_in(str(exc))
        return None
