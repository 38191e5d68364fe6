"""Replay against the live run: a shipped trace driven through a real proxy, whose upstream
serves the trace's answers, gives what `agentproxy replay --json` says, turn by turn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy import cli
from proxy.replay import measure
from proxy.replay.config import built_in
from proxy.replay.engine import SESSION, parse_applied
from proxy.replay.trace import read_trace
from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory

ROOT = Path(__file__).resolve().parents[2]
TRACES = sorted((ROOT / "examples" / "traces").glob("*.jsonl"))


class TraceUpstream:
    """Answers each turn's call with the trace's answer, in order; the summarizer's calls get
    the simulator's scripted summary in their own wire, as replay's do."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        self.answers: Iterator[dict[str, Any]] = iter(t["answer"] for t in turns)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def app(self) -> web.Application:
        return Simulator(context_window=10**9, canned=self.answer).app()

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append((path, body))
        if measure.is_summary(path, body):
            return None
        return next(self.answers)


async def _send(proxy: str, turn: dict[str, Any]) -> tuple[int, dict[str, str]]:
    """The turn's request through the client's own SDK, as an agent would send it."""
    headers = {"x-agentproxy-session": SESSION}
    body = turn["request"]
    if turn["wire"] == "anthropic":
        client = anthropic.AsyncAnthropic(base_url=proxy, api_key="x", max_retries=0)
        raw: Any = await client.messages.with_raw_response.create(**body, extra_headers=headers)
    else:
        chat = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="x", max_retries=0)
        if turn["wire"] == "chat":
            raw = await chat.chat.completions.with_raw_response.create(
                **body, extra_headers=headers
            )
        else:
            raw = await chat.responses.with_raw_response.create(**body, extra_headers=headers)
    return raw.status_code, dict(raw.headers)


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
async def test_replay_gives_the_figures_of_the_live_run(
    trace: Path,
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    turns = read_trace(trace)
    upstream = TraceUpstream(turns)
    server: TestServer = await aiohttp_server(upstream.app())
    config = tmp_path / "live.yaml"
    document = built_in(turns, str(server.make_url("")).rstrip("/"), str(tmp_path / "state"))
    config.write_text(yaml.safe_dump(document))
    proxy = await start_proxy(config)
    live = []
    for turn in turns:
        before = len(upstream.calls)
        status, headers = await _send(str(proxy.make_url("")).rstrip("/"), turn)
        calls = upstream.calls[before:]
        own = [(path, body) for path, body in calls if not measure.is_summary(path, body)]
        live.append({
            "status": status,
            "tokens_sent": measure.prompt_tokens(*own[0]),
            "rewrites": parse_applied(headers.get("x-agentproxy-applied")),
            "summarizer_calls": len(calls) - len(own),
        })  # fmt: skip

    assert await asyncio.to_thread(cli.main, ["replay", str(trace), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    rows = [
        {name: row[name] for name in ("status", "tokens_sent", "rewrites", "summarizer_calls")}
        for row in replayed["calls"]
    ]
    assert rows == live
    # The traces are written to show each thing replay measures.
    stages = replayed["totals"]["rewrites"]
    assert "offload.offloaded" in stages and "repair.patched_dangling" in stages
    assert replayed["totals"]["summarizer_calls"] >= 1
    assert replayed["totals"]["all_valid"]
    assert replayed["totals"]["tokens_sent"] < replayed["totals"]["tokens_received"]
