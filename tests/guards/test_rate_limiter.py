"""The guard on a factory-built exchange: a client that leaves while the shared store is
still taking its admission does not keep what was taken."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from proxy.guards.rate_limits import RateLimiter
from proxy.metrics import Metrics
from proxy.policies.spec import ApiKey, RateLimits
from proxy.recording.events import EventLog
from proxy.recording.recorder import Recorder
from proxy.store.windows import MemoryWindows, Refusal, Subject
from tests.pipeline.factories import exchange


class SlowWindows:
    """In-memory windows behind a store that answers only when told to (a slow Redis)."""

    backend = "slow"

    def __init__(self) -> None:
        self.inner = MemoryWindows()
        self.answer = asyncio.Event()
        self.running: set[asyncio.Future[None]] = set()

    async def take(self, subjects: Sequence[Subject], lease: str, tokens: int) -> Refusal | None:
        """Sent: the store carries it out when it answers, whether or not anyone still waits
        for the reply (as Redis runs a script whose client hung up)."""
        reply: asyncio.Future[Refusal | None] = asyncio.get_running_loop().create_future()

        async def store_side() -> None:
            await self.answer.wait()
            refused = self.inner.take_now(subjects, tokens)
            if not reply.done():
                reply.set_result(refused)

        self.running.add(asyncio.ensure_future(store_side()))
        return await reply

    async def give_back(self, subjects: Sequence[Subject], lease: str, tokens: float) -> None:
        self.inner.give_back_now(subjects, tokens)


async def test_an_admission_cancelled_in_flight_gives_back_what_it_took() -> None:
    windows = SlowWindows()
    metrics = Metrics()
    limiter = RateLimiter(windows, metrics, Recorder(metrics, EventLog(os.devnull)))
    ex = exchange([{"role": "user", "content": "hi"}])
    ex.identity.key = ApiKey("alice", b"-", limits=RateLimits(max_concurrent=1))
    admitting = asyncio.ensure_future(limiter.admit(ex))
    await asyncio.sleep(0.01)  # the take is on its way to the store
    admitting.cancel()  # the client left
    await asyncio.sleep(0.01)
    assert admitting.cancelled()
    windows.answer.set()  # the store takes the slot after all...
    for _ in range(10):
        await asyncio.sleep(0)
    # ...and it was given back: the key's one slot is free.
    subject = [Subject("own|alice", ex.identity.key.limits)]  # type: ignore[list-item]
    assert windows.inner.take_now(subject, 1) is None
