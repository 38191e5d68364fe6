"""The app's shutdown is bounded: a closing step that hangs or fails is named in a warning and
the steps after it (the store's close among them) still run."""

from __future__ import annotations

import asyncio
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
