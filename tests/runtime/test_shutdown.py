"""The app's shutdown is bounded: a closing step that hangs or fails is named in a warning and
the steps after it (the store's close among them) still run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import aiohttp
import pytest

from proxy.pipeline.rewriter import Rewriter
from proxy.runtime import shutdown
from proxy.runtime.shutdown import close_in_order
from proxy.store.local import LocalStore
from tests.conftest import ProxyFactory


async def test_a_hung_step_is_cut_at_the_deadline_and_the_next_steps_run() -> None:
    ran: list[str] = []

    async def hangs() -> None:
        ran.append("hangs")
        await asyncio.Event().wait()

    async def fails() -> None:
        ran.append("fails")
        raise RuntimeError("broken")

    async def closes() -> None:
        ran.append("closes")

    started = time.perf_counter()
    unfinished = await close_in_order(
        [("hung", hangs), ("failing", fails), ("last", closes)], within_s=0.3
    )
    assert unfinished == ["hung", "failing"]
    assert ran == ["hangs", "fails", "closes"]
    # The hung step had the deadline; the later ones their floor, which they did not need.
    assert time.perf_counter() - started < 0.3 + shutdown.STEP_FLOOR_S


async def test_a_proxy_whose_summaries_will_not_stop_still_closes_its_store(
    start_proxy: ProxyFactory,
    config_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def never(self: Rewriter) -> None:
        await asyncio.Event().wait()

    closed: list[LocalStore] = []
    close_store = LocalStore.close

    async def close(self: LocalStore) -> None:
        closed.append(self)
        await close_store(self)

    monkeypatch.setattr(Rewriter, "close", never)
    monkeypatch.setattr(LocalStore, "close", close)
    monkeypatch.setattr(shutdown, "SHUTDOWN_S", 0.5)
    proxy = await start_proxy(config_path)
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url("/healthz")) as response:
            assert response.status == 200
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="agentproxy.shutdown"):
        await proxy.close()
    assert time.perf_counter() - started < 5
    assert closed, "the store was not closed after the hung step"
    [warning] = [r.getMessage() for r in caplog.records if r.name == "agentproxy.shutdown"]
    assert "the summaries written ahead did not finish within" in warning


async def test_a_step_that_swallows_its_cancel_does_not_hold_the_rest() -> None:
    """asyncio.wait_for would wait on it for ever after its timeout."""
    ran: list[str] = []
    released = asyncio.Event()
    stubborn_tasks: list[asyncio.Task[object]] = []

    async def stubborn() -> None:
        stubborn_tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if released.is_set():
                    raise

    async def closes() -> None:
        ran.append("closes")

    started = time.perf_counter()
    unfinished = await close_in_order([("stubborn", stubborn), ("last", closes)], within_s=0.3)
    assert unfinished == ["stubborn"] and ran == ["closes"]
    assert time.perf_counter() - started < 0.3 + shutdown.STEP_FLOOR_S
    released.set()  # this test's loop may close
    [task] = stubborn_tasks
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
