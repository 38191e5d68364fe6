"""The recording's writer under load, at the SQLite store: it keeps up with many new sessions
at once (their state read together, not one store round trip each), and a turn it cannot
record is never lost silently: every one is counted (agentproxy_recorded_turns_total) and shown
for its session in GET /admin/sessions (`not_recorded`, by reason)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.recording import sessions as recording
from proxy.sessions.identity import scoped
from proxy.state import RECORDINGS, STORE
from tests.conftest import ProxyFactory
from tests.recording.test_recording import ALICE, BOB, _outcomes, session, start


async def drive(proxy: TestServer, turns: int, concurrency: int, key: str = ALICE) -> None:
    """`turns` chat turns, each its own session (`s<n>`), `concurrency` at a time."""
    url = str(proxy.make_url("/v1/chat/completions"))
    numbers = iter(range(turns))
    async with aiohttp.ClientSession() as http:

        async def worker() -> None:
            for n in numbers:
                body = {"model": "sim", "messages": [{"role": "user", "content": f"turn {n}"}]}
                headers = {"authorization": f"Bearer {key}", **session(f"s{n}")}
                async with http.post(url, json=body, headers=headers) as response:
                    assert response.status == 200, await response.text()
                    await response.read()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def listed(proxy: TestServer, key: str | None = None) -> list[dict[str, Any]]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as http,
        http.get(str(proxy.make_url("/admin/sessions")), headers=headers) as response,
    ):
        assert response.status == 200
        return list((await response.json())["data"])


async def test_many_new_sessions_at_once_are_all_recorded(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    sent = 1500
    await drive(proxy, sent, concurrency=64)
    await proxy.app[RECORDINGS].flush()
    outcomes = _outcomes(proxy)
    assert outcomes.get("dropped", 0) == 0, outcomes
    assert outcomes["recorded"] == sent
    store = proxy.app[STORE]
    for n in (0, sent // 2, sent - 1):
        blobs = await store.blobs(scoped("key:alice", f"s{n}"))
        assert any(b.kind == "record_turn" for b in blobs), n


async def test_every_turn_not_recorded_is_counted_and_shown_for_its_session(
    start_proxy: ProxyFactory,
    aiohttp_server: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer that falls behind (a slow store, a short queue) drops turns: each one is in
    the metric and in its session's row, for its owner only."""
    monkeypatch.setattr(recording, "QUEUED_TURNS", 8)
    proxy = await start(start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    inner = proxy.app[STORE].inner
    put_many = inner.put_many

    async def slow(items: Any, listed: Any = None) -> None:
        await asyncio.sleep(0.05)
        await put_many(items, listed)

    inner.put_many = slow
    sent = 300
    await drive(proxy, sent, concurrency=32)
    await drive(proxy, 5, concurrency=5, key=BOB)
    await proxy.app[RECORDINGS].flush()
    outcomes = _outcomes(proxy)
    dropped = outcomes.get("dropped", 0)
    assert dropped > 0, outcomes  # the short queue did overflow
    assert outcomes["recorded"] + dropped == sent + 5
    rows = [*await listed(proxy, ALICE), *await listed(proxy, BOB)]  # each key its own
    shown = sum(row["not_recorded"].get("dropped", 0) for row in rows)
    assert shown == dropped
    alices = [row for row in await listed(proxy, ALICE) if row["not_recorded"]]
    assert sum(row["not_recorded"]["dropped"] for row in alices) == dropped - sum(
        row["not_recorded"].get("dropped", 0) for row in rows if row["key"] == "bob"
    )
    for row in alices:  # a dropped turn's session has no recording of it
        recorded = await proxy.app[STORE].blobs(scoped("key:alice", row["session"]))
        assert not [b for b in recorded if b.kind == "record_turn"]
