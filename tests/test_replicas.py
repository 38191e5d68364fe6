"""Two proxy processes sharing one Redis behave as one: a session whose turns alternate between
them gets byte-identical rewrites, one summary per compaction event, and guards that count
every turn once."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import REDIS_URL, free_port, sim_config

ROOT = Path(__file__).resolve().parent.parent
SESSION = "replica-session"
GROWTH_TURNS = 16  # enough to offload, truncate and summarize in a 6,000-token window
LOOP_TURNS = 5  # the same read: twice unremarked, then warn, no_tools, block
BUDGET_CALLS = GROWTH_TURNS + 5  # room for the loop's four answered turns and one more


def config(sim_url: str, store: str) -> str:
    # Summaries inline (prepare_at: null): one process and two replicas then summarize at the
    # same turns (summaries written ahead, shared too, are tests/test_replicas_learn.py's).
    return sim_config(
        sim_url,
        textwrap.dedent(
            f"""\
            {store}
            policies:
              - name: agents
                offload: {{min_tokens: 2000}}
                compaction: {{trigger: 0.7, prepare_at: null}}
                loops: {{window: 6, repeats: 3}}
                budgets:
                  - {{name: turns, scope: session, limits: {{calls: {BUDGET_CALLS}}}}}
            """
        ),
        window=6000,
    )


def history_turns() -> list[list[dict[str, Any]]]:
    """The agent's requests, each its whole history: growth, then a read repeated in a loop,
    then two turns of new work (the budget allows the first only)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Port the billing module to the new API, file by file."},
    ]
    requests: list[list[dict[str, Any]]] = []

    def step(index: int, path: str, result: str) -> None:
        call = {
            "id": f"call_{index}",
            "type": "function",
            "function": {"name": "read_file", "arguments": orjson.dumps({"path": path}).decode()},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": result})
        requests.append(list(messages))

    for index in range(GROWTH_TURNS):
        size = 12_000 if index % 3 == 0 else 1_200  # every third result is offloaded
        body = "".join(f"line {n} of billing/part{index}.py\n" for n in range(size // 28))
        step(index, f"billing/part{index}.py", body)
    for index in range(GROWTH_TURNS, GROWTH_TURNS + LOOP_TURNS):
        step(index, "billing/same.py", "unchanged contents")
    for index in range(GROWTH_TURNS + LOOP_TURNS, GROWTH_TURNS + LOOP_TURNS + 2):
        step(index, f"billing/new{index}.py", "new work")
    return requests


EXPECTED = [200] * (GROWTH_TURNS + LOOP_TURNS - 1) + [429, 200, 429]


class ProxyProcess:
    def __init__(self, config_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "proxy", "serve", "--config", str(config_path)]
        self.process = subprocess.Popen(
            [*command, "--port", str(self.port)],
            cwd=config_path.parent,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    async def ready(self, http: aiohttp.ClientSession, seconds: float = 30.0) -> None:
        for _ in range(int(seconds / 0.05)):
            if self.process.poll() is not None:
                raise AssertionError(f"proxy exited: {self.process.stderr.read()!r}")  # type: ignore[union-attr]
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get(self.url + "/readyz") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.05)
        raise AssertionError(f"proxy on {self.url} not ready in {seconds}s")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        if self.process.stderr is not None:
            self.process.stderr.close()


@contextlib.asynccontextmanager
async def proxies(config_path: Path, count: int) -> AsyncIterator[list[ProxyProcess]]:
    started = [ProxyProcess(config_path) for _ in range(count)]
    try:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(p.ready(http) for p in started))
        yield started
    finally:
        for process in started:
            process.stop()


async def run_session(urls: list[str]) -> tuple[list[int], list[str]]:
    """Every turn to the next proxy in turn; the statuses and the decisions applied."""
    statuses, applied = [], []
    async with aiohttp.ClientSession() as http:
        for number, messages in enumerate(history_turns()):
            url = urls[number % len(urls)] + "/v1/chat/completions"
            body = {"model": "sim", "messages": messages, "max_tokens": 64}
            headers = {"x-agentproxy-session": SESSION}
            async with http.post(url, json=body, headers=headers) as response:
                await response.read()
                statuses.append(response.status)
                applied.append(response.headers.get("x-agentproxy-applied", ""))
    return statuses, applied


async def run(
    aiohttp_server: Any, tmp_path: Path, store: str, replicas: int
) -> tuple[list[int], list[str], list[Any], int]:
    sim = Simulator(context_window=8192, api_key="sk-sim-upstream-secret")
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), store))
    async with proxies(path, replicas) as started:
        statuses, applied = await run_session([p.url for p in started])
    calls = [r.body for r in sim.requests if "summary" not in str(r.body["messages"][0])]
    summaries = len(sim.requests) - len(calls)
    return statuses, applied, calls, summaries


async def test_two_replicas_on_one_redis_act_as_one_process(
    aiohttp_server: Any, tmp_path: Path, redis_prefix: str
) -> None:
    alone = tmp_path / "alone"
    alone.mkdir()
    local = f"store: {{backend: local, path: {alone}}}"
    statuses, applied, calls, summaries = await run(aiohttp_server, alone, local, 1)
    assert statuses == EXPECTED, applied
    assert summaries >= 1, "the session was long enough to need a summary"
    assert any("offload.offloaded" in a for a in applied)

    shared = tmp_path / "shared"
    shared.mkdir()
    redis = f"store: {{backend: redis, url: {REDIS_URL}, prefix: '{redis_prefix}'}}"
    both_statuses, both_applied, both_calls, both_summaries = await run(
        aiohttp_server, shared, redis, 2
    )
    # Budgets and loop detection counted every turn once: the same refusals at the same turns.
    assert both_statuses == EXPECTED
    # Summaries were not recomputed by the replica that did not write them.
    assert both_summaries == summaries
    # What the provider received is byte for byte what one process sends.
    assert len(both_calls) == len(calls)
    for number, (one, two) in enumerate(zip(calls, both_calls, strict=True)):
        assert orjson.dumps(two) == orjson.dumps(one), f"upstream request {number} differs"
    assert [a.split(",") for a in both_applied] == [a.split(",") for a in applied]
