"""The real Claude Code CLI through the proxy's /v1/messages, against the strict Anthropic
twin: a tool round trip, and a long task whose huge tool output is offloaded and whose history
is compacted, the CLI finishing as if nothing had happened."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim import Simulator, run_simulator
from proxy.state import EVENTS
from tests.conftest import ProxyFactory
from tests.support.sim_responders import ToolRounds, ToolRoundTrip

from .conftest import SCRATCH_FILES, ClaudeCode
from .test_claude_code import bash_round_trip

PROXY_KEY = "sk-proxy-claude-code"
UPSTREAM_KEY = "sk-ant-sim-upstream"
MODEL = "claude-opus-5-5"  # what Claude Code asks for by default


async def proxy_for(
    start_proxy: ProxyFactory, tmp_path: Path, sim_url: str, window: int, policy: str = ""
) -> TestServer:
    config = tmp_path / "agentproxy.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            store: {{path: {tmp_path / "state"}}}
            keys:
              api_keys: [{{name: claude-code, key: {PROXY_KEY}}}]
            model_list:
              - model_name: {MODEL}
                litellm_params:
                  model: anthropic/claude-sim
                  api_base: {sim_url}
                  api_key: {UPSTREAM_KEY}
                model_info:
                  max_input_tokens: {window}
            """
        )
        + textwrap.dedent(policy)
    )
    return await start_proxy(config)


@pytest.fixture
async def sim_url(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Simulator, str]]:
    sim: Simulator = request.param
    async with run_simulator(sim) as url:
        yield sim, url


def events(proxy: TestServer, tmp_path: Path) -> list[dict[str, Any]]:
    proxy.app[EVENTS].flush()
    log = tmp_path / "state" / "events.jsonl"
    return [orjson.loads(line) for line in log.read_bytes().splitlines()] if log.exists() else []


async def test_claude_code_round_trips_through_the_proxy(
    claude_code: ClaudeCode, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=200_000, api_key=UPSTREAM_KEY, responder=ToolRoundTrip())
    async with run_simulator(sim) as url:
        proxy = await proxy_for(start_proxy, tmp_path, url, window=200_000)
        base = str(proxy.make_url("")).rstrip("/")
        run = await claude_code.run("list the files here", base_url=base, api_key=PROXY_KEY)
    assert run.exit_code == 0, run.stderr
    assert all(r.status == 200 for r in sim.requests), [r.status for r in sim.requests]
    assert all(r.api_key == UPSTREAM_KEY for r in sim.requests)  # never the client's key
    trip = bash_round_trip(sim.requests[-1])
    assert trip is not None, "no tool_result for the Bash call reached the model"
    assert all(name in run.stdout for name in SCRATCH_FILES), run.stdout
    # Its protocol headers went through, and the thinking turn came back signed and whole.
    last = sim.requests[-1]
    assert last.headers["anthropic-version"] == "2023-06-01"
    assert "claude-code-20250219" in last.betas
    asked, _ = trip
    assert asked["content"][0]["type"] == "thinking" and asked["content"][0]["signature"]


async def test_claude_codes_long_task_is_offloaded_and_compacted(
    claude_code: ClaudeCode, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """One large output (offloaded behind a pointer), then smaller ones that push the history
    past the window the proxy believes in (compacted): Claude Code finishes with exit 0.
    (Claude Code keeps outputs over ~30,000 characters out of the context itself, as a
    `<persisted-output>` preview: "large" here is ~6,000 tokens, offloaded at 4,000.)"""
    commands = ["seq 1 5000", *(f"seq {k} {k + 2000}" for k in range(1, 10))]
    responder = ToolRounds(commands=commands, answer_prefix="Done. Last lines:\n")
    sim = Simulator(context_window=200_000, api_key=UPSTREAM_KEY, responder=responder)
    async with run_simulator(sim) as url:
        offload = "policies:\n  - name: agent\n    offload: {min_tokens: 4000}\n"
        proxy = await proxy_for(start_proxy, tmp_path, url, window=30_000, policy=offload)
        base = str(proxy.make_url("")).rstrip("/")
        run = await claude_code.run(
            "count with seq for me", base_url=base, api_key=PROXY_KEY, timeout_s=180
        )
    assert run.exit_code == 0, run.stderr
    assert "Done. Last lines:" in run.stdout
    assert all(r.status == 200 for r in sim.requests), [r.status for r in sim.requests]
    applied = {(e["stage"], e["action"]) for e in events(proxy, tmp_path)}
    # Every rewrite was filed under Claude Code's own session (its header; also in metadata).
    # Claude Code's own last request (a summary made ahead of time may come after it: no tools).
    last = [r for r in sim.requests if r.body.get("tools")][-1]
    session = orjson.loads(last.body["metadata"]["user_id"])["session_id"]
    assert {e["session"] for e in events(proxy, tmp_path)} == {session}
    assert ("offload", "offloaded") in applied, applied
    assert applied & {("compaction", "summarized"), ("compaction", "middle_out")}, applied
    sent = orjson.dumps(last.body["messages"]).decode()
    # The simulated model answers the summarizer "OK." (no sections): middle-out instead.
    marks = ("tool result was offloaded", "summarized", "cut from the middle")
    assert any(mark in sent for mark in marks)
    assert len(sent) < 4 * 30_000  # what reached the model fits the window it was given
