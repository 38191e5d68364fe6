"""The real Codex CLI through the proxy's /v1/responses, against the strict Responses twin: a
tool round trip, and a long task whose big tool outputs are offloaded and whose history is
compacted, Codex finishing as if nothing had happened."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import orjson
from aiohttp.test_utils import TestServer

from proxy.sim import Simulator, run_simulator
from proxy.state import EVENTS
from tests.conftest import ProxyFactory
from tests.support.sim_responders import ToolRounds, codex_shell_round_trip

from .conftest import CODEX_MODEL, SCRATCH_FILES, Codex
from .test_codex import output_text, shell_round_trip

PROXY_KEY = "sk-proxy-codex"
UPSTREAM_KEY = "sk-sim-upstream-codex"


async def proxy_for(
    start_proxy: ProxyFactory, tmp_path: Path, sim_url: str, window: int, policy: str = ""
) -> TestServer:
    config = tmp_path / "agentproxy.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            store: {{path: {tmp_path / "state"}}}
            keys:
              api_keys: [{{name: codex, key: {PROXY_KEY}}}]
            model_list:
              - model_name: {CODEX_MODEL}
                litellm_params:
                  model: openai/gpt-sim
                  api_base: {sim_url}/v1
                  api_key: {UPSTREAM_KEY}
                model_info:
                  max_input_tokens: {window}
            """
        )
        + textwrap.dedent(policy)
    )
    return await start_proxy(config)


def events(proxy: TestServer, tmp_path: Path) -> list[dict[str, Any]]:
    proxy.app[EVENTS].flush()
    log = tmp_path / "state" / "events.jsonl"
    return [orjson.loads(line) for line in log.read_bytes().splitlines()] if log.exists() else []


async def test_codex_round_trips_through_the_proxy(
    codex: Codex, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(
        context_window=400_000, api_key=UPSTREAM_KEY, responder=codex_shell_round_trip()
    )
    async with run_simulator(sim) as url:
        proxy = await proxy_for(start_proxy, tmp_path, url, window=400_000)
        base = str(proxy.make_url("")).rstrip("/")
        run = await codex.run("list the files here", base_url=base, api_key=PROXY_KEY)
    assert run.exit_code == 0, run.stderr
    assert [r.status for r in sim.requests] == [200] * len(sim.requests)
    assert all(r.api_key == UPSTREAM_KEY for r in sim.requests)  # never the client's key
    trip = shell_round_trip(sim.requests[-1])
    assert trip is not None, "no function_call_output for the exec_command call"
    assert all(name in output_text(trip[1]) for name in SCRATCH_FILES)
    assert "The command listed:" in run.stdout
    # Codex's encrypted reasoning came back sealed and whole (the twin checks its seal).
    assert any(i.get("type") == "reasoning" for i in sim.requests[-1].body["input"])


async def test_codexs_long_task_is_offloaded_and_compacted(
    codex: Codex, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    # Codex cuts a command's output at ~10 kB itself: "big" is ~2,550 tokens, offloaded at
    # 2,400; the others (~1,300 tokens) stay, and push the history past a 20k window.
    commands = ["seq 1 5000", *(f"seq {k} {k + 1000}" for k in range(1, 9))]
    responder = ToolRounds(
        tool="exec_command", commands=commands, answer_prefix="Done. Last lines:\n", key="cmd"
    )
    sim = Simulator(context_window=400_000, api_key=UPSTREAM_KEY, responder=responder)
    offload = "policies:\n  - name: agent\n    offload: {min_tokens: 2400}\n"
    async with run_simulator(sim) as url:
        proxy = await proxy_for(start_proxy, tmp_path, url, window=20_000, policy=offload)
        base = str(proxy.make_url("")).rstrip("/")
        run = await codex.run("count with seq for me", base_url=base, api_key=PROXY_KEY)
    assert run.exit_code == 0, run.stderr
    assert "Done. Last lines:" in run.stdout
    assert [r.status for r in sim.requests] == [200] * len(sim.requests)
    applied = {(e["stage"], e["action"]) for e in events(proxy, tmp_path)}
    assert ("offload", "offloaded") in applied, applied
    assert applied & {("compaction", "summarized"), ("compaction", "middle_out")}, applied
    # Codex's own last request (a summary made ahead of time may come after it: no tools).
    last = [r for r in sim.requests if r.body.get("tools")][-1]
    session = last.body["prompt_cache_key"]  # = its session-id header
    assert {e["session"] for e in events(proxy, tmp_path)} == {session}
    sent = orjson.dumps(last.body["input"]).decode()
    assert len(sent) < 4 * 20_000
