"""What the turn that crosses the compaction trigger adds, summarized inline vs written ahead.

A simulated model on 127.0.0.1 whose summaries take 2 s (every other answer is instant), and
two real proxies in front of it, one with `compaction.prepare_at: null` (inline: the crossing
turn waits for the summarizer) and one with the default 0.75 (the summary is written in the
background once a turn passes 0.75 x the trigger). Each proxy serves the same sessions at once,
replayed from three agent traces, with a think time between turns (the model writing, the
tools running):

    coding   a coding agent: read_file / run_tests calls with big tool results (~1,500 tokens)
    chatty   a chatty assistant: short questions, long prose answers (~400 tokens a turn)
    codex    a Codex-like long session: a long developer prompt, many exec_command calls
             with ~600-token outputs

For every crossing turn (one whose x-agentproxy-applied says compaction.summarized or
middle_out): its latency minus the median latency of its session's other turns. Printed per
mode: crossings, added latency p50 and p95, and, from the proxy's own metrics, the summaries
written ahead started / used / wasted / failed / skipped and the wasted share.

    python bench/prepared_compaction.py            # ~1 min
    python bench/prepared_compaction.py --quick    # fewer turns, ~30 s
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as `python bench/prepared_compaction.py` from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from proxy.app import SERVER_OPTIONS, build_app  # noqa: E402
from proxy.sim.model import is_summary_request, summary_reply  # noqa: E402
from proxy.sim.simulator import Simulator  # noqa: E402

SUMMARY_S = 2.0
WINDOW = 16_000  # tokens, as the proxy is told
HOST = "127.0.0.1"
Message = dict[str, Any]
PROSE = (
    "The report module groups the rows by customer, sums the amounts in cents to avoid "
    "rounding drift, and writes one CSV line per customer sorted by name. "
)


class SlowSummaries:
    """Summaries take SUMMARY_S; the agent's own turns are answered at once."""

    async def __call__(self, chat: dict[str, Any]) -> dict[str, Any]:
        messages = chat.get("messages") or []
        if not is_summary_request(messages):
            return {"role": "assistant", "content": "ok"}
        await asyncio.sleep(SUMMARY_S)
        reply = summary_reply(messages)
        return {"role": "assistant", "content": reply.content if reply else ""}


# --- the traces: each yields, turn after turn, the messages the agent adds before it asks ---


def _call(call_id: str, name: str, arguments: str) -> Message:
    function = {"name": name, "arguments": arguments}
    call = {"id": call_id, "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def coding(turns: int) -> Iterator[list[Message]]:
    yield [
        {"role": "system", "content": "You are a coding agent. " + PROSE * 8},
        {"role": "user", "content": "GOAL: add a per-customer CSV report to src/report.py"},
    ]
    for i in range(1, turns):
        tool = "run_tests" if i % 3 == 0 else "read_file"
        output = f"# src/module_{i}.py\n" + "".join(
            f"def step_{i}_{j}(rows):\n    return sum(r.amount for r in rows if r.id == {j})\n"
            for j in range(70)
        )
        added = [
            _call(f"call_{i}", tool, f'{{"path": "src/module_{i}.py"}}'),
            {"role": "tool", "tool_call_id": f"call_{i}", "content": output},
        ]
        if i % 5 == 0:
            added.append({"role": "user", "content": f"Looks right; keep going with step {i}."})
        yield added


def chatty(turns: int) -> Iterator[list[Message]]:
    yield [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "I am planning a data pipeline; help me think it through."},
    ]
    for i in range(1, turns):
        answer = f"Answer {i}: " + PROSE * 10
        question = f"Question {i}: what about late-arriving rows in partition {i}? " * 3
        yield [{"role": "assistant", "content": answer}, {"role": "user", "content": question}]


def codex(turns: int) -> Iterator[list[Message]]:
    yield [
        {"role": "system", "content": "You are Codex. " + PROSE * 30},
        {"role": "system", "content": "Sandbox: workspace-write; network disabled."},
        {"role": "user", "content": "Fix the flaky test in tests/test_sync.py and explain why."},
    ]
    for i in range(1, turns):
        output = "\n".join(
            f"tests/test_sync.py::test_case_{i}_{j} PASSED [{j}%] in 0.0{j % 9}s" for j in range(42)
        )
        yield [
            _call(f"exec_{i}", "exec_command", f'{{"cmd": "pytest -q tests -k case_{i}"}}'),
            {"role": "tool", "tool_call_id": f"exec_{i}", "content": output},
        ]


TRACES: dict[str, Callable[[int], Iterator[list[Message]]]] = {
    "coding": coding,
    "chatty": chatty,
    "codex": codex,
}
TURNS = {"coding": 24, "chatty": 44, "codex": 40}


@dataclass
class Session:
    name: str
    trace: str
    latencies: list[float] = field(default_factory=list)
    crossings: list[int] = field(default_factory=list)  # turn indexes that compacted

    def added(self) -> list[float]:
        others = [t for i, t in enumerate(self.latencies) if i not in self.crossings]
        base = statistics.median(others) if others else 0.0
        return [self.latencies[i] - base for i in self.crossings]


def config(sim_url: str, state: Path, prepare_at: str, sessions: int) -> str:
    return textwrap.dedent(
        f"""\
        model_list:
          - model_name: sim
            litellm_params: {{model: openai/sim, api_base: "{sim_url}/v1", api_key: sk-sim}}
            model_info: {{max_input_tokens: {WINDOW}}}
        store: {{path: "{state}"}}
        server: {{max_prepared_summaries: {sessions}}}
        policies:
          - name: agents
            compaction: {{prepare_at: {prepare_at}}}
        """
    )


async def play(
    http: aiohttp.ClientSession, url: str, session: Session, turns: int, think_s: float
) -> None:
    history: list[Message] = []
    headers = {"x-agentproxy-session": session.name}
    for index, added in enumerate(TRACES[session.trace](turns)):
        history += added
        started = time.perf_counter()
        body = {"model": "sim", "messages": history}
        async with http.post(url, json=body, headers=headers) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"{session.name} turn {index}: HTTP {response.status}")
            applied = response.headers.get("x-agentproxy-applied", "")
        session.latencies.append(time.perf_counter() - started)
        if "compaction.summarized" in applied or "compaction.middle_out" in applied:
            session.crossings.append(index)
        await asyncio.sleep(think_s)


async def prepared_counts(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with http.get(f"{base}/metrics") as response:
        text = await response.text()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("agentproxy_compaction_prepared_total{"):
            result = line.split('result="')[1].split('"')[0]
            counts[result] = float(line.split()[-1])
    return counts


async def run_mode(
    mode: str, prepare_at: str, copies: int, quick: bool, think_s: float, tmp: Path
) -> tuple[list[Session], dict[str, float]]:
    sim = Simulator(context_window=4 * WINDOW, responder=SlowSummaries(), record=False)
    sim_runner = web.AppRunner(sim.app())
    await sim_runner.setup()
    sim_site = web.TCPSite(sim_runner, HOST, 0)
    await sim_site.start()
    sim_port = sim_runner.addresses[0][1]
    state = tmp / mode
    state.mkdir()
    sessions = [Session(f"{mode}-{trace}-{n}", trace) for trace in TRACES for n in range(copies)]
    path = state / "agentproxy.yaml"
    path.write_text(config(f"http://{HOST}:{sim_port}", state, prepare_at, len(sessions)))
    runner = web.AppRunner(build_app(path, watch=False), **SERVER_OPTIONS)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0)
    await site.start()
    base = f"http://{HOST}:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(
                *(
                    play(
                        http,
                        f"{base}/v1/chat/completions",
                        s,
                        TURNS[s.trace] // (2 if quick else 1),
                        think_s,
                    )
                    for s in sessions
                )
            )
            counts = await prepared_counts(http, base)
    finally:
        await runner.cleanup()
        await sim_runner.cleanup()
    return sessions, counts


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def report(mode: str, sessions: list[Session], counts: dict[str, float]) -> None:
    added = [ms * 1000 for s in sessions for ms in s.added()]
    print(
        f"{mode:9} crossings {len(added):3}   added p50 {percentile(added, 0.5):8.1f} ms"
        f"   p95 {percentile(added, 0.95):8.1f} ms"
    )
    for trace in TRACES:
        mine = [ms * 1000 for s in sessions if s.trace == trace for ms in s.added()]
        print(
            f"  {trace:7} crossings {len(mine):3}   added p50 {percentile(mine, 0.5):8.1f} ms"
            f"   p95 {percentile(mine, 0.95):8.1f} ms"
        )
    if counts:
        started = counts.get("started", 0.0)
        wasted = counts.get("wasted", 0.0)
        share = wasted / started if started else 0.0
        done = sum(counts.get(k, 0.0) for k in ("used", "wasted", "failed"))
        counts = {**counts, "pending at the end": started - done}
        shown = "  ".join(f"{k} {int(v)}" for k, v in counts.items())
        print(f"  written ahead: {shown}   wasted share {100 * share:.1f}%")


async def main_async(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="agentproxy-prepared-") as folder:
        tmp = Path(folder)
        started = time.perf_counter()
        (inline, _), (ahead, counts) = await asyncio.gather(
            run_mode("inline", "null", args.copies, args.quick, args.think, tmp),
            run_mode("prepared", "0.75", args.copies, args.quick, args.think, tmp),
        )
        seconds = time.perf_counter() - started
    print(
        f"summaries take {SUMMARY_S:g} s; window {WINDOW} tokens; {args.copies} session(s) per "
        f"trace per mode; think time {args.think:g} s; {seconds:.0f} s in all"
    )
    report("inline", inline, {})
    report("prepared", ahead, counts)
    goal = [s for session in ahead for s in session.added()]
    wasted = counts.get("wasted", 0.0) / counts["started"] if counts.get("started") else 0.0
    met = percentile(goal, 0.5) < 0.05 and wasted < 0.1
    print(f"goal (prepared adds < 50 ms at p50, wasted < 10%): {'met' if met else 'MISSED'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="half the turns")
    parser.add_argument("--copies", type=int, default=2, help="sessions per trace per mode")
    parser.add_argument("--think", type=float, default=1.0, help="seconds between turns")
    args = parser.parse_args(argv)
    logging.getLogger("agentproxy").setLevel(logging.ERROR)  # the open-proxy warnings
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(main_async(args))
    return 130


if __name__ == "__main__":
    sys.exit(main())
