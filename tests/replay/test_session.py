"""`replay --session ID`: a session read from the store a proxy uses, found under its owner."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy import cli
from proxy.replay import session as sessions
from proxy.replay.engine import parse_applied
from proxy.replay.trace import read_trace
from proxy.state import RECORDINGS
from tests.conftest import ProxyFactory
from tests.replay.test_live import TraceUpstream

ROOT = Path(__file__).resolve().parents[2]
TRACE = read_trace(ROOT / "examples" / "traces" / "coding-agent-chat.jsonl")[:3]


def keyed_config(tmp_path: Path) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            keys:
              api_keys:
                - {{name: alice, key: sk-alice}}
                - {{name: bob, key: sk-bob}}
            store: {{path: {tmp_path / "state"}}}
            model_list:
              - model_name: gpt-4.1-mini
                litellm_params: {{model: openai/gpt-4.1-mini, api_base: "http://127.0.0.1:9/v1"}}
            policies:
              - {{name: alices, match: {{keys: [alice]}}}}
              - {{name: bobs, match: {{keys: [bob]}}, offload: {{min_tokens: 500}}}}
            """
        )
    )
    return path


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[dict[str, Any]]]:
    """What the store holds, by scoped session key, read through a stand-in of recording's
    `recorded_turns` (the store is the real one the config names)."""
    held: dict[str, list[dict[str, Any]]] = {}

    async def recorded_turns(store: Any, session_key: str) -> list[dict[str, Any]]:
        assert hasattr(store, "get_checkpoint")  # the configured store, opened
        return held.get(session_key, [])

    monkeypatch.setattr(sessions, "recording_reader", lambda: recorded_turns)
    return held


def test_the_owner_is_found_and_the_replay_sends_as_that_key(
    tmp_path: Path, recorded: dict[str, list[dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> None:
    config = keyed_config(tmp_path)
    recorded["key:bob/s1"] = TRACE
    assert cli.main(["replay", "--session", "s1", "--config", str(config), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "session s1"
    assert [row["policy"] for row in out["calls"]] == ["bobs"] * 3  # bob's key, bob's policy
    assert any(r["action"] == "offloaded" for r in out["calls"][1]["rewrites"])


def test_a_session_id_two_owners_use_needs_key(
    tmp_path: Path, recorded: dict[str, list[dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> None:
    config = keyed_config(tmp_path)
    recorded["key:bob/s1"] = TRACE
    recorded["key:alice/s1"] = TRACE[:1]
    args = ["replay", "--session", "s1", "--config", str(config), "--json"]
    assert cli.main(args) == 2
    assert "recorded for several keys (alice, bob): choose one with --key" in (
        capsys.readouterr().err
    )
    assert cli.main([*args, "--key", "alice"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [row["policy"] for row in out["calls"]] == ["alices"]

    assert cli.main([*args[:-1], "--key", "carol"]) == 2
    assert "--key carol: no such key; one of alice, bob" in capsys.readouterr().err
    assert cli.main(["replay", "--session", "s2", "--config", str(config)]) == 2
    assert "no recorded session 's2' (searched: key:alice, key:bob)" in capsys.readouterr().err


async def test_a_session_recorded_by_a_running_proxy_replays_to_the_same_figures(
    tmp_path: Path,
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Recorded by a proxy that keeps running while replay reads its store (SQLite in WAL
    mode takes the second reader)."""
    upstream = TraceUpstream(TRACE)
    server: TestServer = await aiohttp_server(upstream.app())
    url = str(server.make_url("")).rstrip("/")
    config = keyed_config(tmp_path)
    text = config.read_text().replace('"http://127.0.0.1:9/v1"', f'"{url}/v1"')
    config.write_text(
        text.replace(
            "offload: {min_tokens: 500}", "offload: {min_tokens: 500}, record: {enabled: true}"
        )
    )
    proxy = await start_proxy(config)
    live = []
    for turn in TRACE:
        async with aiohttp.ClientSession() as http:
            async with http.post(
                proxy.make_url("/v1/chat/completions"),
                json=turn["request"],
                headers={"authorization": "Bearer sk-bob", "x-agentproxy-session": "s1"},
            ) as response:
                assert response.status == 200
                live.append(parse_applied(response.headers.get("x-agentproxy-applied")))
    await proxy.app[RECORDINGS].flush()  # the writer lingers a moment for more turns
    args = ["replay", "--session", "s1", "--config", str(config), "--json"]
    assert await asyncio.to_thread(cli.main, args) == 0
    out = json.loads(capsys.readouterr().out)
    assert [row["rewrites"] for row in out["calls"]] == live
