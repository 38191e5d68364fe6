"""What the crossing turn adds on a replica that did not write the summary: shared vs apart.

Two real proxies, replicas A and B (in the benchmark's process), on the machine's Redis
(127.0.0.1:6379; a key prefix of the run's own, deleted after), in front of a simulated model
on 127.0.0.1 whose summaries take 2 s. Every session (bench/prepared_compaction.py's three
traces) sends its turns to A until the one that crosses the compaction trigger, and that one
to B (a load balancer moving the session); A wrote the summary ahead (prepare_at 0.75) and the
agent thinks long enough before the crossing turn for it to be written. Two modes, side by
side, each with its own two replicas and Redis prefix:

    shared   as the proxy is: B's crossing turn takes A's summary from Redis
    apart    sharing turned off in both replicas (the instances' hooks, in this script):
             what replicas did before, B summarizes inline

The crossing turn of each trace is found first, through one proxy with instant summaries (the
first crossing depends only on the history's size). Printed per mode: crossings on B, their
added latency (the turn's latency minus the median of the session's turns on A) p50 and p95,
and the summarizer calls the model received.

    python bench/shared_prepared.py             # ~40 s
    python bench/shared_prepared.py --copies 1  # one session per trace
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
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prepared_compaction import HOST, SUMMARY_S, TRACES, TURNS, WINDOW, Message, percentile

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as `python bench/shared_prepared.py` from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from proxy.app import SERVER_OPTIONS, build_app  # noqa: E402
from proxy.sim.model import is_summary_request, summary_reply  # noqa: E402
from proxy.sim.simulator import Simulator  # noqa: E402
from proxy.state import FLOW  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/0"
MORE_ON_B = 4


class Summaries:
    """Summaries take `delay_s` (counted); the agent's own turns are answered at once."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.calls = 0

    async def __call__(self, chat: dict[str, Any]) -> dict[str, Any]:
        messages = chat.get("messages") or []
        if not is_summary_request(messages):
            return {"role": "assistant", "content": "ok"}
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        reply = summary_reply(messages)
        return {"role": "assistant", "content": reply.content if reply else ""}


@dataclass
class Session:
    name: str
    trace: str
    crossing: int  # the turn that crosses the trigger: sent to B
    on_a: list[float] = field(default_factory=list)
    added: float | None = None  # the crossing turn's latency minus the median on A
    summarized: bool = False  # B's crossing turn compacted


def config(sim_url: str, store: str, sessions: int, prepare_at: str) -> str:
    return textwrap.dedent(
        f"""\
        model_list:
          - model_name: sim
            litellm_params: {{model: openai/sim, api_base: "{sim_url}/v1", api_key: sk-sim}}
            model_info: {{max_input_tokens: {WINDOW}}}
        store: {store}
        server: {{max_prepared_summaries: {sessions}}}
        policies:
          - name: agents
            compaction: {{prepare_at: {prepare_at}}}
        """
    )


@contextlib.asynccontextmanager
async def served(app: web.Application, **options: Any) -> Any:
    runner = web.AppRunner(app, **options)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0)
    await site.start()
    try:
        yield f"http://{HOST}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def turn(
    http: aiohttp.ClientSession, base: str, session: str, history: list[Message]
) -> tuple[float, str]:
    started = time.perf_counter()
    body = {"model": "sim", "messages": history}
    headers = {"x-agentproxy-session": session}
    async with http.post(f"{base}/v1/chat/completions", json=body, headers=headers) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"{session}: HTTP {r.status}")
        return time.perf_counter() - started, r.headers.get("x-agentproxy-applied", "")


def compacted(applied: str) -> bool:
    return "compaction.summarized" in applied or "compaction.middle_out" in applied


async def crossings(tmp: Path) -> dict[str, int]:
    """Each trace's first crossing turn, through one proxy with instant summaries."""
    sim = Simulator(context_window=4 * WINDOW, responder=Summaries(0.0), record=False)
    found: dict[str, int] = {}
    async with served(sim.app()) as sim_url:
        path = tmp / "calibrate.yaml"
        path.write_text(config(sim_url, f'{{path: "{tmp / "calibrate"}"}}', 3, "null"))
        async with served(build_app(path, watch=False), **SERVER_OPTIONS) as base:
            async with aiohttp.ClientSession() as http:
                for trace, steps in TRACES.items():
                    history: list[Message] = []
                    for index, added in enumerate(steps(TURNS[trace])):
                        history += added
                        _, applied = await turn(http, base, f"calibrate-{trace}", history)
                        if compacted(applied):
                            found[trace] = index
                            break
    return found


def share_nothing(app: web.Application) -> None:
    """Replicas as they were: a summary written ahead lives in its replica alone."""
    prepared = app[FLOW].rewriter.compaction.prepared

    async def nothing_shared(*_: Any) -> None:
        return None

    async def claimed(*_: Any) -> bool:
        return True

    prepared.find_shared = nothing_shared
    prepared._claim = claimed
    prepared._publish = nothing_shared


async def play(
    http: aiohttp.ClientSession, a: str, b: str, session: Session, think_s: float
) -> None:
    """Turns to A until the crossing one; it and up to MORE_ON_B more to B until one compacts
    (B's own token measure of the session starts afresh: it may cross a turn or two later)."""
    history: list[Message] = []
    steps = TRACES[session.trace](session.crossing + 1 + MORE_ON_B)
    for index, added in enumerate(steps):
        history += added
        if index < session.crossing:
            seconds, _ = await turn(http, a, session.name, history)
            session.on_a.append(seconds)
            await asyncio.sleep(think_s)
            continue
        if index == session.crossing:
            await asyncio.sleep(SUMMARY_S + 0.5)  # A's summary is written meanwhile
        seconds, applied = await turn(http, b, session.name, history)
        if compacted(applied):
            session.added = seconds - statistics.median(session.on_a)
            session.summarized = True
            return
        await asyncio.sleep(think_s)


async def run_mode(
    mode: str, found: dict[str, int], copies: int, think_s: float, tmp: Path
) -> tuple[list[Session], int]:
    summaries = Summaries(SUMMARY_S)
    sim = Simulator(context_window=4 * WINDOW, responder=summaries, record=False)
    prefix = f"agentproxy-bench-{uuid.uuid4().hex[:12]}:"
    sessions = [
        Session(f"{mode}-{trace}-{n}", trace, at)
        for trace, at in found.items()
        for n in range(copies)
    ]
    path = tmp / f"{mode}.yaml"
    store = f"{{backend: redis, url: {REDIS_URL}, prefix: '{prefix}'}}"
    try:
        async with served(sim.app()) as sim_url:
            path.write_text(config(sim_url, store, len(sessions), "0.75"))
            app_a, app_b = build_app(path, watch=False), build_app(path, watch=False)
            if mode == "apart":
                share_nothing(app_a)
                share_nothing(app_b)
            async with (
                served(app_a, **SERVER_OPTIONS) as a,
                served(app_b, **SERVER_OPTIONS) as b,
                aiohttp.ClientSession() as http,
            ):
                await asyncio.gather(*(play(http, a, b, s, think_s) for s in sessions))
    finally:
        await forget(prefix)
    return sessions, summaries.calls


async def forget(prefix: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    keys = [key async for key in client.scan_iter(match=prefix + "*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def report(mode: str, sessions: list[Session], calls: int) -> None:
    def line(label: str, group: list[Session], tail: str = "") -> None:
        added = [1000 * s.added for s in group if s.added is not None]
        print(
            f"{label:9} crossings on B {len(added):2}   added p50 {percentile(added, 0.5):8.1f} ms"
            f"   p95 {percentile(added, 0.95):8.1f} ms{tail}"
        )

    line(mode, sessions, f"   summarizer calls {calls:2} for {len(sessions)} sessions")
    for trace in TRACES:
        line(f"  {trace}", [s for s in sessions if s.trace == trace])


async def main_async(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="agentproxy-shared-") as folder:
        tmp = Path(folder)
        found = await crossings(tmp)
        started = time.perf_counter()
        (shared, shared_calls), (apart, apart_calls) = await asyncio.gather(
            run_mode("shared", found, args.copies, args.think, tmp),
            run_mode("apart", found, args.copies, args.think, tmp),
        )
        seconds = time.perf_counter() - started
    print(
        f"summaries take {SUMMARY_S:g} s; window {WINDOW} tokens; crossing turns {found}; "
        f"{args.copies} session(s) per trace per mode; think time {args.think:g} s; "
        f"{seconds:.0f} s in all"
    )
    report("shared", shared, shared_calls)
    report("apart", apart, apart_calls)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--copies", type=int, default=2, help="sessions per trace per mode")
    parser.add_argument("--think", type=float, default=0.3, help="seconds between turns on A")
    args = parser.parse_args(argv)
    logging.getLogger("agentproxy").setLevel(logging.ERROR)  # the open-proxy warnings
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(main_async(args))
    return 130


if __name__ == "__main__":
    sys.exit(main())
