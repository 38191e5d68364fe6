"""The soak of issue 13: agents write three times the store's cap through a real proxy.

Three sessions stay active throughout (two keys, one session name shared across them); a
stream of one-off sessions writes the bulk; a few sessions written first then go quiet. The
store must stay under its cap on disk the whole time, every reference the active sessions'
current requests name must still resolve (for its own key only), and the quiet sessions must
be gone once their TTL has passed.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from proxy.state import METRICS, STORE
from tests.conftest import ProxyFactory, sim_config

MB = 1024 * 1024
CAP_MB = 3
RESULT_BYTES = 16 * 1024
CHURN_RESULTS = 8  # 128 KB a request
# ~0.8 MB/s: the live second of it (live_s) is a third of the cap, the TTL's worth is more
# than twice the cap: the cap has to evict, even on a machine busy enough to halve the rate.
CHURN_EVERY_S = 0.16
TTL_S = 10
REF = re.compile(r"ap_[0-9a-f]{24}")
SETTINGS = f"""
keys:
  api_keys:
    - {{name: alice, key: sk-alice}}
    - {{name: bob, key: sk-bob}}
policies:
  - name: soak
    offload: {{min_tokens: 200}}
    compaction: {{enabled: false}}
store:
  max_mb: {CAP_MB}
  live_s: 1
  session_ttl: {TTL_S}s
  gc_interval_s: 0.5
"""


def tool_result(tag: str) -> str:
    """A distinct, incompressible-looking result of RESULT_BYTES."""
    return f"{tag}\n" + os.urandom(RESULT_BYTES // 2).hex()[: RESULT_BYTES - len(tag) - 1]


class Agent:
    """One session: a growing history of tool calls, re-sent whole every turn."""

    def __init__(self, key: str, base: str, session: str) -> None:
        self.key = key
        self.client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
        self.session = session
        self.marker = f"work {session} for {key}"  # finds its requests at the upstream
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": self.marker}]
        self.calls = 0

    def add_results(self, count: int) -> None:
        for _ in range(count):
            self.calls += 1
            call_id = f"call_{self.calls}"
            call = {"id": call_id, "type": "function",
                    "function": {"name": "read_file", "arguments": "{}"}}  # fmt: skip
            self.messages += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call_id,
                 "content": tool_result(f"{self.session} {call_id}")},
            ]  # fmt: skip

    async def turn(self) -> None:
        reply = await self.client.chat.completions.create(
            model="sim",
            messages=self.messages,  # type: ignore[arg-type]
            extra_headers={"x-agentproxy-session": self.session},
        )
        self.messages.append({"role": "assistant", "content": reply.choices[0].message.content})


def on_disk(data: Path) -> int:
    return sum(
        (data / f"store.sqlite3{suffix}").stat().st_size
        for suffix in ("", "-wal")
        if (data / f"store.sqlite3{suffix}").exists()
    )


def written(proxy: TestServer) -> float:
    registry = proxy.app[METRICS].registry
    return sum(
        registry.get_sample_value("agentproxy_store_written_bytes_total", {"kind": kind}) or 0.0
        for kind in ("tool_result", "checkpoint")
    )


def refs_sent(sim: Simulator, agent: Agent) -> set[str]:
    """The references in the last request the upstream received for this agent's turn."""
    body = next(
        r.body for r in reversed(sim.requests) if r.body["messages"][0]["content"] == agent.marker
    )
    return set(REF.findall(str(body["messages"])))


async def test_three_times_the_cap_stays_under_it_and_live_references_resolve(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=1_000_000)
    upstream: TestServer = await aiohttp_server(sim.app())
    data = tmp_path / "data"
    config = tmp_path / "agentproxy.yaml"
    url = str(upstream.make_url("")).rstrip("/")
    config.write_text(sim_config(url, SETTINGS + f"  path: {data}\n", window=1_000_000))
    proxy = await start_proxy(config)
    base = str(proxy.make_url("/v1"))
    alice, bob = "sk-alice", "sk-bob"

    quiet = [Agent(alice, base, f"quiet-{n}") for n in range(4)]
    for agent in quiet:
        agent.add_results(3)
        await agent.turn()
    quiet_refs = {ref for agent in quiet for ref in refs_sent(sim, agent)}
    assert len(quiet_refs) == 12

    active = [Agent(alice, base, "active-1"), Agent(alice, base, "active-2"),
              Agent(bob, base, "active-1")]  # fmt: skip
    peak = 0
    stop = asyncio.Event()

    async def keep_working(agent: Agent) -> None:
        """A turn every ~0.1 s, a new result every ~12 turns: always live."""
        turns = 0
        while not stop.is_set():
            if turns % 12 == 0:
                agent.add_results(1)
            await agent.turn()
            turns += 1
            await asyncio.sleep(0.1)

    async def watch_the_disk() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, on_disk(data))
            await asyncio.sleep(0.01)

    workers = [asyncio.create_task(keep_working(a)) for a in active]
    watcher = asyncio.create_task(watch_the_disk())
    started = time.monotonic()
    churned = 0
    try:
        # 3x the cap, and until the cap has had to evict (the TTL alone may keep up with a
        # slowed churn for a while).
        while written(proxy) < 3 * CAP_MB * MB or not removed(proxy, "evicted"):
            assert time.monotonic() - started < 60, "the soak is bounded in time"
            churned += 1
            churn = Agent(alice if churned % 2 else bob, base, f"churn-{churned}")
            churn.add_results(CHURN_RESULTS)
            await asyncio.gather(churn.turn(), asyncio.sleep(CHURN_EVERY_S))
        evicted = removed(proxy, "evicted")
        await asyncio.sleep(TTL_S + 1.5)  # the churn expires; the active sessions go on
    finally:
        stop.set()
        await asyncio.gather(*workers, watcher)

    assert peak <= CAP_MB * MB, f"{peak / MB:.2f} MB on disk at its peak"
    named: list[set[str]] = []
    for agent in active:  # what their current requests name is all there, for them only
        await agent.turn()
        refs = refs_sent(sim, agent)
        assert len(refs) == agent.calls
        named.append(refs)
        stranger = bob if agent.key == alice else alice
        for ref in refs:
            assert await fetch(base, agent.key, ref) == 200, (agent.session, ref)
            assert await fetch(base, stranger, ref) == 404
    assert not named[0] & named[2], "one session name, two keys: two sessions"
    for ref in quiet_refs:
        assert await fetch(base, alice, ref) == 404, ref
    assert evicted > 0, "the cap, not only the TTL, kept the store under it"
    assert removed(proxy, "expired") > 0
    store = proxy.app[STORE].inner  # type: ignore[attr-defined]
    for _ in range(50):  # the last churn expires within a collection or two; a busy machine lags
        stats = await store.stats(live_after=time.time() - 1)
        if stats.sessions == 3:
            break
        await asyncio.sleep(0.1)
    assert stats.sessions == 3, "only the active sessions are left"


def removed(proxy: TestServer, reason: str) -> float:
    registry = proxy.app[METRICS].registry
    labels = {"reason": reason}
    return registry.get_sample_value("agentproxy_store_sessions_removed_total", labels) or 0.0


async def fetch(base: str, key: str, ref: str) -> int:
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {key}"}
        async with http.get(f"{base}/agentproxy/archive/{ref}", headers=headers) as response:
            return response.status
