"""What session affinity does for a long session's prompt cache on a two-deployment alias.

Two simulators on 127.0.0.1 serve one alias (`sim`): each has a prompt cache of its own, as two
provider accounts or regions do. A real proxy in front of them, once with `routing: {affinity:
none}` (the deployments in turn, the proxy before affinity) and once with `affinity: session`
(the default), serves the same 40-turn session whose history grows every turn (a coding
agent's: a tool result of ~300 tokens and a short answer a turn), in two wire formats:

    chat       OpenAI Chat Completions: automatic prefix caching (proxy/sim/prefix_cache.py),
               `usage.prompt_tokens_details.cached_tokens` of `prompt_tokens`
    messages   Anthropic Messages, the newest block marked `cache_control` as Claude Code does
               (proxy/sim/prompt_cache.py): `cache_read_input_tokens` of all input tokens
               (uncached + cache writes + cache reads)

Printed side by side from one run: per wire and mode, the input tokens, the cached ones, the
cache-hit ratio (cached / input) and the turns each deployment answered; with `--sessions N`,
N such sessions at once (affinity spreads them over the deployments).

    python bench/affinity.py                 # ~5 s
    python bench/affinity.py --turns 80 --sessions 4
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as `python bench/affinity.py` from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from proxy.app import SERVER_OPTIONS, build_app  # noqa: E402
from proxy.sim.simulator import Simulator  # noqa: E402

HOST = "127.0.0.1"
MODES = ("none", "session")
WIRES = ("chat", "messages")
UPSTREAM_KEY = "sk-sim-bench"
WINDOW = 200_000  # large: nothing is compacted, the cache alone is measured
SYSTEM = "You are a coding agent working in a Python repository. " * 40  # ~500 tokens
RESULT = (
    "def parse(line):\n    fields = line.split(',')\n    return Row(fields[0], int(fields[1]))\n"
) * 14  # ~300 tokens, a file read or a test run's output


@dataclass
class Tally:
    input_tokens: int = 0
    cached_tokens: int = 0
    written_tokens: int = 0  # Anthropic's cache writes (billed above plain input)
    turns: int = 0
    by_deployment: list[int] = field(default_factory=lambda: [0, 0])

    @property
    def ratio(self) -> float:
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0


def config(urls: list[str], affinity: str, state: Path) -> str:
    models = "".join(
        f"  - model_name: sim\n    litellm_params: {{model: openai/sim, api_base: {url}/v1, "
        f"api_key: {UPSTREAM_KEY}}}\n"
        f"    model_info: {{max_input_tokens: {WINDOW}}}\n"
        f"  - model_name: claude\n    litellm_params: {{model: anthropic/claude-sim, "
        f"api_base: {url}, api_key: {UPSTREAM_KEY}}}\n"
        f"    model_info: {{max_input_tokens: {WINDOW}}}\n"
        for url in urls
    )
    return (
        f"store: {{path: {state}}}\nmodel_list:\n{models}"
        f"policies:\n  - name: bench\n    routing: {{affinity: {affinity}}}\n"
    )


def user_turn(wire: str, turn: int) -> dict[str, Any]:
    text = f"Turn {turn}: the output of `cat src/rows_{turn}.py`:\n{RESULT}"
    if wire == "chat":
        return {"role": "user", "content": text}
    block = {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}
    return {"role": "user", "content": [block]}


def without_breakpoints(message: dict[str, Any]) -> dict[str, Any]:
    """A past user turn as Claude Code re-sends it: its cache_control moved to the newest."""
    content = message["content"]
    if isinstance(content, list):
        return {**message, "content": [{k: v for k, v in b.items() if k != "cache_control"}
                                       for b in content]}  # fmt: skip
    return message


async def play(
    http: aiohttp.ClientSession, base: str, wire: str, name: str, turns: int, tally: Tally
) -> None:
    history: list[dict[str, Any]] = []
    system_text = f"Session {name}. {SYSTEM}"  # sessions share no prefix
    # A think time between turns, seeded: sessions at once arrive in no fixed order (in
    # lockstep, round-robin would hand each session the same deployment every turn by chance).
    think = random.Random(name)
    headers = {"x-agentproxy-session": name}
    for turn in range(turns):
        await asyncio.sleep(think.uniform(0, 0.004))
        history = [without_breakpoints(m) for m in history] + [user_turn(wire, turn)]
        if wire == "chat":
            body: dict[str, Any] = {
                "model": "sim",
                "messages": [{"role": "system", "content": system_text}, *history],
            }
            url = f"{base}/v1/chat/completions"
        else:
            system = [{"type": "text", "text": system_text, "cache_control": {"type": "ephemeral"}}]
            body = {"model": "claude", "max_tokens": 256, "system": system, "messages": history}
            url = f"{base}/v1/messages"
        async with http.post(url, json=body, headers=headers) as response:
            answer = await response.json()
            if response.status != 200:
                raise SystemExit(f"turn {turn} of {name} ({wire}): {response.status} {answer}")
        usage = answer["usage"]
        if wire == "chat":
            tally.input_tokens += usage["prompt_tokens"]
            tally.cached_tokens += (usage.get("prompt_tokens_details") or {}).get(
                "cached_tokens", 0
            )
            history.append(answer["choices"][0]["message"])
        else:
            read = usage.get("cache_read_input_tokens") or 0
            written = usage.get("cache_creation_input_tokens") or 0
            tally.input_tokens += usage["input_tokens"] + read + written
            tally.cached_tokens += read
            tally.written_tokens += written
            history.append({"role": "assistant", "content": answer["content"]})
        tally.turns += 1


async def run_mode(
    affinity: str, sims: list[Simulator], urls: list[str], turns: int, sessions: int, tmp: Path
) -> dict[str, Tally]:
    state = tmp / affinity
    state.mkdir()
    path = state / "agentproxy.yaml"
    path.write_text(config(urls, affinity, state))
    runner = web.AppRunner(build_app(path, watch=False), **SERVER_OPTIONS)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0)
    await site.start()
    base = f"http://{HOST}:{runner.addresses[0][1]}"
    tallies = {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            for wire in WIRES:
                for sim in sims:
                    sim.reset()  # each mode starts with cold caches
                tally = tallies[wire] = Tally()
                await asyncio.gather(
                    *(play(http, base, wire, f"{wire}-{n}", turns, tally) for n in range(sessions))
                )
                tally.by_deployment = [sim.request_count for sim in sims]
    finally:
        await runner.cleanup()
    return tallies


async def main(turns: int, sessions: int) -> None:
    sims = [Simulator(context_window=WINDOW, api_key=UPSTREAM_KEY, record=False) for _ in "ab"]
    runners, urls = [], []
    for sim in sims:
        runner = web.AppRunner(sim.app())
        await runner.setup()
        await web.TCPSite(runner, HOST, 0).start()
        runners.append(runner)
        urls.append(f"http://{HOST}:{runner.addresses[0][1]}")
    try:
        with tempfile.TemporaryDirectory(prefix="agentproxy-affinity-") as tmp:
            results = {mode: await run_mode(mode, sims, urls, turns, sessions, Path(tmp))
                       for mode in MODES}  # fmt: skip
    finally:
        for runner in runners:
            await runner.cleanup()
    print(f"{sessions} session(s) of {turns} turns, alias of 2 deployments, cold caches per run")
    print(f"{'wire':9}{'affinity':10}{'input tok':>11}{'cached tok':>12}{'hit ratio':>11}"
          f"{'cache writes':>14}{'turns on #0 / #1':>19}")  # fmt: skip
    for wire in WIRES:
        for mode in MODES:
            t = results[mode][wire]
            print(
                f"{wire:9}{mode:10}{t.input_tokens:11,}{t.cached_tokens:12,}{t.ratio:11.1%}"
                f"{t.written_tokens if wire == 'messages' else '-':>14}"
                f"{t.by_deployment[0]:>12} / {t.by_deployment[1]}"
            )
        none, session = results["none"][wire].ratio, results["session"][wire].ratio
        uncached = (1 - session) / (1 - none) if none < 1 else float("nan")
        print(f"{wire:9}uncached input with affinity: {uncached:.2f}x of without")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=40, help="turns a session [40]")
    parser.add_argument("--sessions", type=int, default=1, help="sessions at once [1]")
    args = parser.parse_args()
    if not 1 <= args.turns <= 400 or not 1 <= args.sessions <= 64:
        parser.error("--turns must be 1..400 and --sessions 1..64")
    return args


if __name__ == "__main__":
    args = parse()
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(main(args.turns, args.sessions))
