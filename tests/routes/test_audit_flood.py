"""Refused admin callers cannot crowd out the audit nor the log, over real sockets: past a few
entries of their own a window, per address and for all addresses, refusals are counted and
summed up in one entry (`suppressed`); a genuine entry made after a flood is still among the
newest; every refusal is still a 401 in the client's wire format, and counted in a metric."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.recording import auth_failures
from proxy.sim.simulator import Simulator
from tests.conftest import REDIS_URL, ProxyFactory, sim_config
from tests.routes.test_runtime_keys import ADMIN_KEY, call

WRONG = "sk-wrong-admin-guess-5678"
WINDOW_S = 2.0  # the window, made short enough to see it end


def config(sim_url: str, store: str) -> str:
    return sim_config(sim_url, f"store: {store}\nkeys:\n  admin_key: {ADMIN_KEY}\n")


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, store: str
) -> TestServer:
    path = tmp_path / "admin.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), store))
    return await start_proxy(path, watch=False)


async def refuse(proxy: TestServer, times: int, source: str = "127.0.0.1") -> float:
    """`times` refused admin requests from `source` (a loopback address), 50 at once; each must
    be the usual 401. Returns how long they took."""
    began = time.monotonic()
    connector = aiohttp.TCPConnector(local_addr=(source, 0), limit=50)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one(n: int) -> None:
            headers = {"Authorization": f"Bearer {WRONG}"}
            path = "/admin/keys" if n % 2 else "/admin/policies"
            async with http.get(str(proxy.make_url(path)), headers=headers) as response:
                assert response.status == 401
                body = await response.json()
                assert body["error"]["code"] == "invalid_api_key"

        await asyncio.gather(*(one(n) for n in range(times)))
    return time.monotonic() - began


async def refusals_seen(proxy: TestServer, total: int) -> list[dict[str, Any]]:
    """The audit's `admin.auth_failed` entries, once they account for `total` refusals (the
    last window's summary is written when the window ends)."""
    failed: list[dict[str, Any]] = []
    for _ in range(int(WINDOW_S * 20) + 40):
        status, page = await call(proxy, "GET", "/admin/audit?limit=1000")
        assert status == 200, page
        failed = [e for e in page["entries"] if e["action"] == "admin.auth_failed"]
        if sum(e.get("suppressed", 1) for e in failed) >= total:
            return failed
        await asyncio.sleep(0.1)
    return failed


async def metric(proxy: TestServer, name: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as http:
        async with http.get(str(proxy.make_url("/metrics"))) as response:
            text = await response.text()
    return {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith(name)
    }


@pytest.mark.parametrize("backend", ["local", "redis"])
async def test_a_flood_of_refusals_from_one_address_is_summed_up_not_written_one_by_one(
    backend: str,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    aiohttp_server: Any,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(auth_failures, "WINDOW_S", WINDOW_S)
    store = f"{{path: {tmp_path / 'state'}}}"
    if backend == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        store = f"{{backend: redis, url: '{REDIS_URL}', prefix: '{prefix}'}}"
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(Simulator().app()), store)

    took = await refuse(proxy, 1000)
    status, made = await call(proxy, "POST", "/admin/keys", {"name": "after-the-flood"})
    assert status == 201, made

    failed = await refusals_seen(proxy, 1000)
    own = [e for e in failed if "suppressed" not in e]
    summaries = [e for e in failed if "suppressed" in e]
    windows = math.ceil(took / WINDOW_S) + 1  # windows the flood can have touched
    assert 0 < len(own) <= auth_failures.RECORDED_PER_ADDRESS * windows
    assert 0 < len(summaries) <= windows
    assert len(own) + sum(e["suppressed"] for e in summaries) == 1000  # every refusal told
    for summary in summaries:
        assert summary["from"] == "127.0.0.1" and summary["who"] == "unknown"
        assert summary["window"]["end"] - summary["window"]["start"] == pytest.approx(WINDOW_S)
    for entry in own:
        assert entry["path"] in ("/admin/keys", "/admin/policies") and entry["presented_key"]

    # The genuine entry made after the flood: among the newest, past only the last summary.
    _, newest = await call(proxy, "GET", "/admin/audit?limit=3")
    actions = [e["action"] for e in newest["entries"]]
    assert "key.create" in actions
    created = next(e for e in newest["entries"] if e["action"] == "key.create")
    assert created["key"]["name"] == "after-the-flood"

    # The log: one line per entry, not per refusal; no secret anywhere.
    lines = [r.getMessage() for r in caplog.records if r.name == "agentproxy.audit"]
    assert sum('"admin.auth_failed"' in line for line in lines) == len(failed)
    everything = "\n".join(r.getMessage() for r in caplog.records) + orjson.dumps(failed).decode()
    for secret in (WRONG, ADMIN_KEY, made["key"]):
        assert secret not in everything

    counted = await metric(proxy, "agentproxy_admin_auth_failures_total")
    assert counted == {
        'agentproxy_admin_auth_failures_total{audit="recorded"}': len(own),
        'agentproxy_admin_auth_failures_total{audit="coalesced"}': 1000 - len(own),
    }


async def test_many_addresses_are_held_to_the_cap_for_all_and_summed_up_together(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    aiohttp_server: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """30 loopback addresses (127.0.0.2 …): each under its own limit at first, together past
    the cap for all; past SUMMARIES_PER_WINDOW (and MAX_ADDRESSES tracked) they are one entry."""
    monkeypatch.setattr(auth_failures, "WINDOW_S", 30.0)  # one window, ended by the shutdown
    monkeypatch.setattr(auth_failures, "RECORDED_PER_WINDOW", 12)
    monkeypatch.setattr(auth_failures, "SUMMARIES_PER_WINDOW", 4)
    monkeypatch.setattr(auth_failures, "MAX_ADDRESSES", 20)
    store = f"{{path: {tmp_path / 'state'}}}"
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(Simulator().app()), store)
    sources = [f"127.0.0.{n}" for n in range(2, 32)]
    await asyncio.gather(*(refuse(proxy, 6 + n, source) for n, source in enumerate(sources)))
    total = sum(6 + n for n in range(len(sources)))

    _, page = await call(proxy, "GET", "/admin/audit?limit=1000")
    own = [e for e in page["entries"] if e["action"] == "admin.auth_failed"]
    assert len(own) == 12 and all("suppressed" not in e for e in own)  # the cap for all
    per_address = {a: [e["from"] for e in own].count(a) for a in {e["from"] for e in own}}
    assert max(per_address.values()) <= auth_failures.RECORDED_PER_ADDRESS  # first comers
    counted = await metric(proxy, "agentproxy_admin_auth_failures_total")
    assert counted['agentproxy_admin_auth_failures_total{audit="coalesced"}'] == total - 12

    # The window ends (here: the proxy stops, and says what it had counted).
    await proxy.close()
    path = tmp_path / "admin.yaml"
    again = await start_proxy(path, watch=False)
    _, page = await call(again, "GET", "/admin/audit?limit=1000")
    failed = [e for e in page["entries"] if e["action"] == "admin.auth_failed"]
    summaries = [e for e in failed if "suppressed" in e]
    by_address = [e for e in summaries if e["from"] is not None]
    (rest,) = [e for e in summaries if e["from"] is None]
    assert len(by_address) == 4  # the most refused addresses, one entry each
    # The other 16 tracked, and the refusals of the 10 past MAX_ADDRESSES (not tracked).
    assert rest["addresses"] == 20 - 4
    assert len(failed) == 12 + 4 + 1
    assert 12 + sum(e["suppressed"] for e in summaries) == total
    await again.close()


async def test_a_days_entries_are_capped_and_the_rest_still_summed_up(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    aiohttp_server: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auth_failures, "WINDOW_S", WINDOW_S)
    monkeypatch.setattr(auth_failures, "RECORDED_PER_DAY", 3)
    store = f"{{path: {tmp_path / 'state'}}}"
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(Simulator().app()), store)
    await refuse(proxy, 10)
    await refuse(proxy, 4, "127.0.0.9")
    failed = await refusals_seen(proxy, 14)
    own = [e for e in failed if "suppressed" not in e]
    assert len(own) == 3  # the day's, all spent
    # No summary of their own either (the day's entries are spent): one for all, each window.
    summaries = [e for e in failed if "suppressed" in e]
    assert summaries and all(e["from"] is None for e in summaries)
    assert 3 + sum(e["suppressed"] for e in summaries) == 14
