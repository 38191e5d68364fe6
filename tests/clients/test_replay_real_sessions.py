"""Sessions recorded from the real Claude Code, Codex and Gemini CLIs, replayed: every turn replays
with the status it had live, and every request replay sends upstream is valid.

Each CLI runs three tool rounds through a recording proxy in front of the strict twin; the
session is then replayed from the proxy's store by `agentproxy replay --session` (in a thread:
the command runs its own event loop), as a user would after the proxy stopped, and from a
trace file of its turns with the demo's configuration, whose policy rewrites them."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp.test_utils import TestServer

from proxy import cli
from proxy.recording.sessions import recorded_turns
from proxy.replay.client_turns import numbered
from proxy.sessions.identity import scoped
from proxy.sim import Simulator, run_simulator
from proxy.state import RECORDINGS, STORE
from tests.conftest import ProxyFactory
from tests.support.sim_responders import ToolRounds

from .conftest import CODEX_MODEL, ClaudeCode, Codex
from .test_claude_code import bash_round_trip
from .test_codex import shell_round_trip
from .test_gemini_cli_proxy import GEMINI_MODEL, SHELL_TOOL, GeminiCLI
from .test_gemini_cli_proxy import gemini_cli as gemini_cli  # the fixture

PROXY_KEY = "sk-proxy-replayed"
UPSTREAM_KEY = "sk-sim-upstream-replayed"
CLAUDE_MODEL = "claude-opus-5-5"  # what Claude Code asks for by default
# Tool rounds: a listing, then outputs the demo's policy offloads (over 500 tokens).
COMMANDS = ["ls", "seq 1 1500", "seq 1 800"]


def recording_config(tmp_path: Path, alias: str, model: str, base: str) -> Path:
    config = tmp_path / "agentproxy.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            store: {{path: {tmp_path / "state"}}}
            keys:
              api_keys: [{{name: agent, key: {PROXY_KEY}}}]
            model_list:
              - model_name: {alias}
                litellm_params: {{model: {model}, api_base: "{base}", api_key: {UPSTREAM_KEY}}}
                model_info: {{max_input_tokens: 400000}}
            policies:
              - name: recorded
                record: {{enabled: true}}
            """
        )
    )
    return config


async def replayed(*args: str) -> dict[str, Any]:
    """`agentproxy replay ARGS --json`, its output parsed."""
    argv = ["replay", *args, "--json"]
    out: list[str] = []

    def run() -> int:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            code = cli.main(argv)
        out.append(buffer.getvalue())
        return code

    assert await asyncio.to_thread(run) == 0, out
    report: dict[str, Any] = json.loads(out[0])
    return report


def assert_replays_as_live(report: dict[str, Any], live: list[int]) -> None:
    """Under the recording's own policy and against the defaults alike."""
    for run in (report, report["against"]):
        rows = run["calls"]
        assert [r["status"] for r in rows] == live, [r["problems"] for r in rows]
        assert run["totals"]["all_valid"], [(r["call"], r["problems"]) for r in rows]
        assert all(r["problems"] == [] for r in rows), [r["problems"] for r in rows]


async def recorded(proxy: TestServer, session: str, trace: Path) -> list[dict[str, Any]]:
    """The session's recorded turns, also written to `trace` as a trace file."""
    await proxy.app[RECORDINGS].flush()  # the writer lingers a moment for more turns
    turns = await recorded_turns(proxy.app[STORE], scoped("key:agent", session))
    lines = b"".join(orjson.dumps(turn) + b"\n" for turn in turns)
    await asyncio.to_thread(trace.write_bytes, lines)
    return turns


def applied(names: list[dict[str, Any]]) -> list[str]:
    return sorted(f"{n['stage']}.{n['action']}" for n in names)


async def assert_session_replays_as_live(
    config: Path, session: str, trace: Path, turns: list[dict[str, Any]]
) -> None:
    """From the store with the proxy's configuration: the statuses and rewrites of the live
    run (one call upstream a turn, as live: none retried). As a trace file with the demo's
    configuration (offload above 500 tokens, an 8,192-token window): the live statuses, and
    every rewritten request valid."""
    live = [turn["status"] for turn in turns]
    assert len(live) >= 2 and set(live) == {200}, live
    from_store = await replayed(
        "--session", session, "--config", str(config), "--against", "default"
    )
    assert_replays_as_live(from_store, live)
    rows = from_store["calls"]
    assert [applied(r["rewrites"]) for r in rows] == [applied(t["events"]) for t in turns]
    assert [r["upstream_calls"] for r in rows] == [1] * len(rows)
    # Each call's client turn as recorded; and as replay works it out for a trace without it.
    counted = [(t["turn"], t["opens"]) for t in turns]
    assert [(r["turn"], r["opens"]) for r in rows] == counted
    bare = [{k: v for k, v in t.items() if k not in ("turn", "opens")} for t in turns]
    assert [(c["turn"], c["opens"]) for c in numbered(bare)] == counted
    from_file = await replayed(str(trace), "--against", "default")
    assert_replays_as_live(from_file, live)
    assert from_file["totals"]["rewrites"].get("offload.offloaded"), from_file["totals"]


async def test_a_claude_code_session_replays_as_it_ran(
    claude_code: ClaudeCode, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    responder = ToolRounds(commands=COMMANDS)
    sim = Simulator(context_window=200_000, api_key=UPSTREAM_KEY, responder=responder)
    async with run_simulator(sim) as url:
        config = recording_config(tmp_path, CLAUDE_MODEL, "anthropic/claude-sim", url)
        proxy = await start_proxy(config)
        base = str(proxy.make_url("")).rstrip("/")
        run = await claude_code.run("list the files here", base_url=base, api_key=PROXY_KEY)
        assert run.exit_code == 0, run.stderr
        assert bash_round_trip(sim.requests[-1]) is not None
        session = orjson.loads(sim.requests[-1].body["metadata"]["user_id"])["session_id"]
        turns = await recorded(proxy, session, tmp_path / "trace.jsonl")
    await proxy.close()
    await assert_session_replays_as_live(config, session, tmp_path / "trace.jsonl", turns)


async def test_a_codex_session_replays_as_it_ran(
    codex: Codex, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    responder = ToolRounds(tool="exec_command", commands=COMMANDS, key="cmd")
    sim = Simulator(context_window=400_000, api_key=UPSTREAM_KEY, responder=responder)
    async with run_simulator(sim) as url:
        config = recording_config(tmp_path, CODEX_MODEL, "openai/gpt-sim", f"{url}/v1")
        proxy = await start_proxy(config)
        base = str(proxy.make_url("")).rstrip("/")
        run = await codex.run("list the files here", base_url=base, api_key=PROXY_KEY)
        assert run.exit_code == 0, run.stderr
        assert shell_round_trip(sim.requests[-1]) is not None
        session = sim.requests[-1].body["prompt_cache_key"]  # = its session-id header
        turns = await recorded(proxy, session, tmp_path / "trace.jsonl")
    await proxy.close()
    await assert_session_replays_as_live(config, session, tmp_path / "trace.jsonl", turns)


async def test_a_gemini_cli_session_replays_as_it_ran(
    gemini_cli: GeminiCLI, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """Its session is named by a fingerprint (the CLI sends no id): found in the listing."""
    responder = ToolRounds(tool=SHELL_TOOL, commands=COMMANDS)
    sim = Simulator(context_window=400_000, api_key=UPSTREAM_KEY, responder=responder)
    async with run_simulator(sim) as url:
        config = recording_config(tmp_path, GEMINI_MODEL, "openai/sim", f"{url}/v1")
        proxy = await start_proxy(config)
        base = str(proxy.make_url("")).rstrip("/")
        run = await gemini_cli.run("list the files here", base_url=base, api_key=PROXY_KEY)
        assert run.exit_code == 0, run.stdout + run.stderr
        async with aiohttp.ClientSession() as http:
            listed = await http.get(
                str(proxy.make_url("/admin/sessions")),
                headers={"authorization": f"Bearer {PROXY_KEY}"},
            )
            [session] = [s["session"] for s in (await listed.json())["data"]]
        turns = await recorded(proxy, session, tmp_path / "trace.jsonl")
    await proxy.close()
    await assert_session_replays_as_live(config, session, tmp_path / "trace.jsonl", turns)
