"""Replicas share what they learn (issue 41, item 6): two proxies on one real Redis, in one
test process, over real sockets. A summary one replica wrote ahead is taken by the other's
crossing turn (one summarizer call in all); a second key sending the same session id and the
same history never gets it; a deployment fact one replica learnt spares the other the failing
route."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import REDIS_URL, OwnRedis, ProxyFactory, sim_config, start_redis
from tests.pipeline.compaction.factories import user
from tests.pipeline.compaction.test_prepared import (
    ALICE,
    BOB,
    KEYS,
    SUMMARY_S,
    WINDOW,
    SlowSummaries,
    ask,
    prepared,
    start_history,
    summary_requests,
    to_band,
    to_crossing,
    turn_text,
)
from tests.support.sim_llama import LlamaCppSimulator
from tests.support.sim_routes import REFUSED, serving_only


async def two_replicas(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    url: str,
    prefix: str,
    extra: str = "",
    redis_url: str = REDIS_URL,
) -> tuple[TestServer, TestServer]:
    """Two proxies of one config on one Redis: replicas behind a load balancer."""
    store = f"store: {{backend: redis, url: {redis_url}, prefix: '{prefix}'}}\n"
    path = tmp_path / "agentproxy.yaml"
    path.write_text(sim_config(url, store + extra, window=WINDOW))
    return await start_proxy(path), await start_proxy(path)


async def test_a_summary_one_replica_wrote_ahead_serves_the_others_crossing_turn(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, redis_prefix: str
) -> None:
    sim = Simulator(context_window=32_768, responder=SlowSummaries())
    upstream: TestServer = await aiohttp_server(sim.app())
    url = str(upstream.make_url("")).rstrip("/")
    a, b = await two_replicas(start_proxy, tmp_path, url, redis_prefix)
    history = start_history()
    await to_band(a, sim, history)  # replica A starts writing the summary
    await asyncio.sleep(SUMMARY_S + 0.5)  # the agent thinks; A's summary is written, shared
    seconds, applied = await to_crossing(b, history)  # every later turn to replica B
    assert "compaction.summarized" in applied
    assert summary_requests(sim) == 1  # B neither wrote its own ahead nor summarized inline
    assert seconds < SUMMARY_S / 2, seconds
    assert await prepared(a, "started") == 1
    assert await prepared(b, "started") == 0  # A had claimed it: B wrote none of its own
    assert await prepared(b, "used") == 1  # B applied a summary it did not compute
    # And the turn after goes on from the checkpoint B made, on A: no further call.
    history.append({"role": "user", "content": "Go on."})
    _, applied = await ask(a, history)
    assert "compaction.checkpoint_reused" in applied
    assert summary_requests(sim) == 1


async def test_a_summary_written_ahead_for_one_key_is_not_anothers(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, redis_prefix: str
) -> None:
    """Bob sends Alice's session id and her very history: he gets a summary of his own."""
    sim = Simulator(context_window=32_768, responder=SlowSummaries())
    upstream: TestServer = await aiohttp_server(sim.app())
    url = str(upstream.make_url("")).rstrip("/")
    a, b = await two_replicas(start_proxy, tmp_path, url, redis_prefix, KEYS)
    alices = start_history()
    await to_band(a, sim, alices, key=ALICE)
    await asyncio.sleep(SUMMARY_S + 0.5)  # Alice's summary is written and shared
    bobs = [dict(m) for m in alices]
    _, applied = await to_crossing(b, bobs, key=BOB)
    assert "compaction.summarized" in applied
    assert summary_requests(sim) == 2  # Bob's own: Alice's was neither his to use nor to claim
    # Alice's own crossing, on B too, still takes hers.
    seconds, applied = await to_crossing(b, alices, key=ALICE)
    assert "compaction.summarized" in applied
    assert seconds < SUMMARY_S / 2, seconds
    assert summary_requests(sim) == 2


async def test_a_crossing_turn_goes_on_without_a_store_that_stopped_answering(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, own_redis: OwnRedis
) -> None:
    """Redis gone after A wrote the summary: B's crossing turn neither waits nor fails; it does
    what a turn with nothing prepared does without a store (nothing leaves the context)."""
    port, processes = own_redis
    start_redis(port, processes)
    sim = Simulator(context_window=32_768, responder=SlowSummaries())
    upstream: TestServer = await aiohttp_server(sim.app())
    url = str(upstream.make_url("")).rstrip("/")
    redis_url = f"redis://127.0.0.1:{port}/0"
    a, b = await two_replicas(start_proxy, tmp_path, url, "outage:", redis_url=redis_url)
    history = start_history()
    await to_band(a, sim, history)
    await asyncio.sleep(SUMMARY_S + 0.5)
    processes[0].terminate()
    processes[0].wait(5)
    history.append(user(turn_text(len(history)) * 4))  # past the trigger at once
    seconds, applied = await ask(b, history)
    # As with nothing prepared: the archive write fails, so nothing leaves the context; the
    # stage itself did not fail on the shared summary it could not read.
    assert "compaction.store_failed" in applied and "stage_failed" not in applied, applied
    assert seconds < SUMMARY_S, seconds  # one failed read, bounded by store.timeout_s
    assert summary_requests(sim) == 1  # A's only


@pytest.mark.parametrize(
    ("served_route", "route", "body", "note"),
    [
        (  # a Responses-only deployment: chat clients go as Responses (no_chat)
            "/v1/responses",
            "/v1/chat/completions",
            {"model": "sim", "messages": [{"role": "user", "content": "hello"}]},
            "compat.chat_as_responses",
        ),
        (  # a chat-only server: Responses clients go as chat (the wire's native route)
            "/v1/chat/completions",
            "/v1/responses",
            {"model": "sim", "input": "hello"},
            "responses_as_chat",
        ),
    ],
)
async def test_a_deployment_fact_one_replica_learnt_spares_the_other_the_failing_route(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    redis_prefix: str,
    served_route: str,
    route: str,
    body: dict[str, Any],
    note: str,
) -> None:
    sim = Simulator()
    app = serving_only(sim, served_route)
    upstream = TestServer(app, host="127.0.0.1")
    await upstream.start_server()
    try:
        url = str(upstream.make_url("")).rstrip("/")
        a, b = await two_replicas(start_proxy, tmp_path, url, redis_prefix)
        async with aiohttp.ClientSession() as http:
            async with http.post(str(a.make_url(route)), json=body) as r:
                assert r.status == 200, await r.text()
            assert app[REFUSED] == [route]  # A learnt it the hard way
            learnt_at = time.monotonic()
            await asyncio.sleep(1.5)  # "within about a second"
            async with http.post(str(b.make_url(route)), json=body) as r:
                assert r.status == 200, await r.text()
                assert note in r.headers.get("x-agentproxy-applied", "")
        assert app[REFUSED] == [route], "B tried the route A learnt is missing"
        assert time.monotonic() - learnt_at < 5
    finally:
        await upstream.close()


async def test_a_null_content_refusal_one_replica_learnt_spares_the_other_a_refusal(
    start_proxy: ProxyFactory, tmp_path: Path, redis_prefix: str
) -> None:
    sim = LlamaCppSimulator()  # refuses an assistant message's null content with a 500
    upstream = TestServer(sim.app(), host="127.0.0.1")
    await upstream.start_server()
    call = {"id": "c1", "type": "function", "function": {"name": "read_log", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "Find the error."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ERROR at line 3"},
    ]
    body = {"model": "sim", "messages": messages}
    try:
        url = str(upstream.make_url("")).rstrip("/")
        a, b = await two_replicas(start_proxy, tmp_path, url, redis_prefix)
        async with aiohttp.ClientSession() as http:
            async with http.post(str(a.make_url("/v1/chat/completions")), json=body) as r:
                assert r.status == 200, await r.text()
            assert len(sim.requests) == 2  # refused, then sent with the content emptied
            await asyncio.sleep(1.5)
            async with http.post(str(b.make_url("/v1/chat/completions")), json=body) as r:
                assert r.status == 200, await r.text()
                assert "compat.emptied_null_content" in r.headers.get("x-agentproxy-applied", "")
        assert len(sim.requests) == 3, "B sent the null content A learnt is refused"
    finally:
        await upstream.close()
