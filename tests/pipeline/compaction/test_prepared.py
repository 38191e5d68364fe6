"""Summaries written ahead of the trigger (compaction.prepare_at), through the real proxy over
real sockets: a simulated model whose summaries take a second, and an agent whose history grows
~600 tokens a turn in an 8,192-token window (the band starts near turn 8, the trigger near 11).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.pipeline.compaction import CompactionStage
from proxy.sim.model import is_summary_request, summary_reply
from proxy.sim.simulator import Simulator
from proxy.state import EVENTS, FLOW
from tests.conftest import SimProxyFactory
from tests.pipeline.compaction.factories import GOAL, Scripted, context, exchange, target, user

WINDOW = 8_192
SUMMARY_S = 1.0
ALICE, BOB = "sk-alice-0001", "sk-bob-0002"
KEYS = f"""
keys:
  api_keys:
    - {{name: alice, key: {ALICE}}}
    - {{name: bob, key: {BOB}}}
"""
Message = dict[str, Any]


class SlowSummaries:
    """The model: every summary request takes `delay_s`; every other turn answers "ok"."""

    def __init__(self, delay_s: float = SUMMARY_S) -> None:
        self.delay_s = delay_s
        self.summaries = 0

    async def __call__(self, chat: dict[str, Any]) -> dict[str, Any]:
        messages = chat.get("messages") or []
        if not is_summary_request(messages):
            return {"role": "assistant", "content": "ok"}
        self.summaries += 1
        await asyncio.sleep(self.delay_s)
        reply = summary_reply(messages)
        assert reply is not None
        return {"role": "assistant", "content": reply.content}


def turn_text(n: int) -> str:
    prose = "The parser reads each line of the input file and splits it on commas. " * 34
    return f"Step {n}: look at src/mod{n}.py and tell me what it does.\n{prose}"


async def ask(
    proxy: TestServer, history: list[Message], session: str = "agent", key: str | None = None
) -> tuple[float, str]:
    """One turn: its wall time and x-agentproxy-applied; the answer joins the history."""
    headers = {"x-agentproxy-session": session}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    started = time.perf_counter()
    async with aiohttp.ClientSession() as http:
        url = str(proxy.make_url("/v1/chat/completions"))
        async with http.post(url, json={"model": "sim", "messages": history}, headers=headers) as r:
            assert r.status == 200, await r.text()
            body = await r.json()
            applied = r.headers.get("x-agentproxy-applied", "")
    history.append(body["choices"][0]["message"])
    return time.perf_counter() - started, applied


def start_history() -> list[Message]:
    return [{"role": "system", "content": "You are a careful coding agent."}, user(GOAL)]


async def to_band(proxy: TestServer, sim: Simulator, history: list[Message], **who: Any) -> None:
    """Turns until a summary request reaches the model (the band: prepare_at passed)."""
    for _ in range(30):
        history.append(user(turn_text(len(history))))
        _, applied = await ask(proxy, history, **who)
        assert "summarized" not in applied, "the trigger came before the band"
        await asyncio.sleep(0.05)
        if summary_requests(sim):
            return
    raise AssertionError("the history never reached prepare_at")


async def to_crossing(proxy: TestServer, history: list[Message], **who: Any) -> tuple[float, str]:
    """Turns until one compacts: that one's wall time and applied header."""
    for _ in range(30):
        history.append(user(turn_text(len(history))))
        seconds, applied = await ask(proxy, history, **who)
        if "compaction.summarized" in applied or "compaction.middle_out" in applied:
            return seconds, applied
    raise AssertionError("the history never crossed the trigger")


def summary_requests(sim: Simulator) -> int:
    return sum(is_summary_request(r.body.get("messages") or []) for r in sim.requests)


async def prepared(proxy: TestServer, result: str) -> float:
    async with aiohttp.ClientSession() as http:
        async with http.get(str(proxy.make_url("/metrics"))) as response:
            text = await response.text()
    line = f'agentproxy_compaction_prepared_total{{result="{result}"}} '
    found = [row for row in text.splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def summarized_events(proxy: TestServer, tmp_path: Any) -> list[dict[str, Any]]:
    proxy.app[EVENTS].flush()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    events = [orjson.loads(line) for line in lines]
    return [e for e in events if (e["stage"], e["action"]) == ("compaction", "summarized")]


def policy(compaction: str = "{}", budgets: str = "[]") -> str:
    return f"""
policies:
  - name: p
    compaction: {compaction}
    budgets: {budgets}
"""


async def test_the_crossing_turn_takes_the_summary_written_ahead(
    proxy_for: SimProxyFactory, tmp_path: Any
) -> None:
    sim = Simulator(context_window=32_768, responder=SlowSummaries())
    proxy = await proxy_for(sim, policy(), window=WINDOW)
    history = start_history()
    await to_band(proxy, sim, history)
    await asyncio.sleep(SUMMARY_S + 0.3)  # the agent thinks; the summary is written meanwhile
    seconds, applied = await to_crossing(proxy, history)
    assert "compaction.summarized" in applied
    assert seconds < SUMMARY_S / 2, seconds
    assert summary_requests(sim) == 1  # no second call at the crossing
    [event] = summarized_events(proxy, tmp_path)
    assert event["prepared"] is True and event["summarizer_seconds"] < 0.05
    assert await prepared(proxy, "started") == 1
    assert await prepared(proxy, "used") == 1
    assert await prepared(proxy, "wasted") == 0


async def test_without_prepare_at_the_crossing_turn_waits_for_the_summary(
    proxy_for: SimProxyFactory, tmp_path: Any
) -> None:
    sim = Simulator(context_window=32_768, responder=SlowSummaries())
    proxy = await proxy_for(sim, policy("{prepare_at: null}"), window=WINDOW)
    seconds, applied = await to_crossing(proxy, start_history())
    assert "compaction.summarized" in applied
    assert seconds >= SUMMARY_S
    [event] = summarized_events(proxy, tmp_path)
    assert "prepared" not in event
    assert await prepared(proxy, "started") == 0


async def test_a_crossing_turn_waits_for_a_summary_still_being_written(
    proxy_for: SimProxyFactory, tmp_path: Any
) -> None:
    """Rather than a second summarizer call: the crossing turn awaits the one in flight."""
    sim = Simulator(context_window=32_768, responder=SlowSummaries())
    proxy = await proxy_for(sim, policy(), window=WINDOW)
    history = start_history()
    await to_band(proxy, sim, history)
    _, applied = await to_crossing(proxy, history)
    assert "compaction.summarized" in applied
    assert summary_requests(sim) == 1
    [event] = summarized_events(proxy, tmp_path)
    assert event["prepared"] is True and event["summarizer_seconds"] > 0


async def test_a_history_that_changed_is_summarized_inline_and_the_summary_wasted(
    proxy_for: SimProxyFactory,
) -> None:
    sim = Simulator(context_window=32_768, responder=SlowSummaries())
    proxy = await proxy_for(sim, policy(), window=WINDOW)
    history = start_history()
    await to_band(proxy, sim, history)
    await asyncio.sleep(SUMMARY_S + 0.3)
    history[2] = user("An earlier turn, edited: " + turn_text(2))  # the client rewrote it
    history.append(user(turn_text(len(history)) * 4))  # ...and crosses the trigger at once
    seconds, applied = await ask(proxy, history)
    assert "compaction.summarized" in applied
    assert seconds >= SUMMARY_S  # summarized inline
    assert await prepared(proxy, "wasted") >= 1
    assert await prepared(proxy, "used") == 0


async def test_one_summary_per_session_even_under_concurrent_turns(
    proxy_for: SimProxyFactory,
) -> None:
    sim = Simulator(context_window=32_768, responder=SlowSummaries())
    proxy = await proxy_for(sim, policy(), window=WINDOW)
    history = start_history()
    await to_band(proxy, sim, history)
    history.append(user(turn_text(99)))
    await asyncio.gather(*(ask(proxy, list(history)) for _ in range(6)))
    await asyncio.sleep(SUMMARY_S + 0.3)
    assert summary_requests(sim) == 1
    assert await prepared(proxy, "started") == 1


async def test_summaries_in_flight_are_bounded_for_the_whole_process(
    proxy_for: SimProxyFactory,
) -> None:
    sim = Simulator(context_window=32_768, responder=SlowSummaries(delay_s=3.0))
    extra = policy() + "server: {max_prepared_summaries: 1}\n"
    proxy = await proxy_for(sim, extra, window=WINDOW)
    one, two = start_history(), start_history()
    await to_band(proxy, sim, one, session="one")
    for _ in range(10):  # the second session into the band while the first's runs
        two.append(user(turn_text(len(two))))
        _, applied = await ask(proxy, two, session="two")
        assert "summarized" not in applied
    assert summary_requests(sim) == 1
    assert await prepared(proxy, "skipped") >= 1


async def test_no_summary_is_written_ahead_past_a_budget(proxy_for: SimProxyFactory) -> None:
    """The session's answers fit its completion budget; a summary of any size would not."""
    sim = Simulator(context_window=32_768, responder=SlowSummaries())
    budget = "[{name: small, scope: session, limits: {completion_tokens: 40}}]"
    proxy = await proxy_for(sim, policy(budgets=budget), window=WINDOW)
    history = start_history()
    for _ in range(9):  # into the band, under the trigger
        history.append(user(turn_text(len(history))))
        await ask(proxy, history)
    await asyncio.sleep(0.2)
    assert summary_requests(sim) == 0
    assert await prepared(proxy, "skipped") >= 1
    assert await prepared(proxy, "started") == 0


async def test_a_prepared_summary_is_charged_to_the_session(proxy_for: SimProxyFactory) -> None:
    """Its usage reaches the session's spend though no request is open when it ends."""
    sim = Simulator(context_window=32_768, responder=SlowSummaries(delay_s=0.5))
    budget = "[{name: spend, scope: session, limits: {prompt_tokens: 1000000}}]"
    proxy = await proxy_for(sim, policy(budgets=budget), window=WINDOW)
    history = start_history()
    await to_band(proxy, sim, history)
    state = proxy.app[FLOW].rewriter.ctx.state
    before = await state.counters("budget", "spend|session|open:/agent|0")
    await asyncio.sleep(0.8)  # the summary ends, no request open
    after = await state.counters("budget", "spend|session|open:/agent|0")
    assert after["prompt_tokens"] > before["prompt_tokens"] + 1_000  # the transcript
    assert after["completion_tokens"] > before["completion_tokens"]
    assert after["calls"] == before["calls"]  # a summary is not one of the agent's calls


async def test_shutdown_cancels_the_summaries_being_written(
    proxy_for: SimProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    sim = Simulator(context_window=32_768, responder=SlowSummaries(delay_s=30.0))
    proxy = await proxy_for(sim, policy(), window=WINDOW)
    history = start_history()
    await to_band(proxy, sim, history)
    summaries = proxy.app[FLOW].rewriter.compaction.prepared
    [task] = list(summaries._running)
    started = time.perf_counter()
    await proxy.close()
    assert time.perf_counter() - started < 5
    assert task.cancelled() and not summaries._running
    assert "Task was destroyed" not in caplog.text


async def test_a_second_tenant_with_the_same_session_id_does_not_get_the_summary(
    proxy_for: SimProxyFactory,
) -> None:
    sim = Simulator(context_window=32_768, responder=SlowSummaries())
    proxy = await proxy_for(sim, KEYS + policy(), window=WINDOW)
    alice = start_history()
    await to_band(proxy, sim, alice, key=ALICE)
    await asyncio.sleep(SUMMARY_S + 0.3)
    bob = [dict(m) for m in alice]  # the very same history and session id, another key
    seconds, applied = await to_crossing(proxy, bob, key=BOB)
    assert "compaction.summarized" in applied
    # Bob waited for a summary of his own (alice's was ready): started on his first turn.
    assert seconds >= SUMMARY_S / 2
    seconds, applied = await to_crossing(proxy, alice, key=ALICE)
    assert "compaction.summarized" in applied and seconds < SUMMARY_S / 2
    assert summary_requests(sim) == 2
    assert await prepared(proxy, "used") == 2


async def test_a_session_gone_idle_drops_its_summary() -> None:
    """forget (the session idle): the summary being written is cancelled, counted wasted."""
    stage = CompactionStage()
    ctx = context(Scripted(delay_s=10.0))
    history: list[Message] = [*start_history()]
    deployment = target(2_000)
    while not len(stage.prepared):
        history += [user(turn_text(len(history))[:600]), {"role": "assistant", "content": "ok"}]
        await stage.run(exchange(history, deployment=deployment), history, ctx)
    [task] = list(stage.prepared._running)
    stage.forget({"s1"})
    await asyncio.sleep(0)
    assert task.cancelled() or task.cancelling()
    assert not len(stage.prepared)
    metrics = ctx.metrics
    assert metrics.child(metrics.compaction_prepared, "wasted")._value.get() == 1
    await stage.close()
