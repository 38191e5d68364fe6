"""The real Claude Code CLI against the strict Anthropic twin: a full tool round trip.

The fixture takes any loopback base URL; these tests point it straight at the simulator, and
the proxy's Anthropic route tests point the same fixture at the proxy.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from proxy.sim import RecordedRequest, Simulator, run_simulator
from proxy.sim.model import text_of
from tests.support.sim_responders import ToolRoundTrip

from .conftest import SCRATCH_FILES, ClaudeCode, pinned_version, strace_works

KEY = "sk-ant-sim-claude-code"
JSON = dict[str, Any]


def blocks(message: JSON) -> list[JSON]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def bash_round_trip(request: RecordedRequest) -> tuple[JSON, JSON] | None:
    """(the assistant message calling Bash, the tool_result block answering it), if any."""
    messages = request.body.get("messages") or []
    for asked, answered in itertools.pairwise(messages):
        for call in blocks(asked):
            if call.get("type") != "tool_use" or call.get("name") != "Bash":
                continue
            for result in blocks(answered):
                if result.get("type") == "tool_result" and result["tool_use_id"] == call["id"]:
                    return asked, result
    return None


async def test_claude_code_runs_a_bash_round_trip(claude_code: ClaudeCode) -> None:
    sim = Simulator(context_window=200_000, api_key=KEY, responder=ToolRoundTrip())
    async with run_simulator(sim) as url:
        run = await claude_code.run("list the files here", base_url=url, api_key=KEY, trace=True)
    assert run.exit_code == 0, run.stderr
    requests = [r for r in sim.requests if r.path == "/v1/messages"]
    assert requests, "Claude Code sent no Messages request"
    assert [r.status for r in sim.requests] == [200] * len(sim.requests), "a request was refused"

    # The tool round trip: Claude Code ran `ls` for the Bash call and sent back its output.
    trip = bash_round_trip(requests[-1])
    assert trip is not None, "no tool_result for the Bash call"
    asked, result = trip
    listing = text_of(result.get("content"))
    assert all(name in listing for name in SCRATCH_FILES), listing
    assert "The command listed:" in run.stdout
    assert all(name in run.stdout for name in SCRATCH_FILES), run.stdout
    # It asked for thinking and returned our signed block first, which the twin accepted.
    assert requests[-1].body["thinking"]["type"] in ("enabled", "adaptive")
    assert blocks(asked)[0]["type"] == "thinking" and blocks(asked)[0]["signature"]

    # What it sends, for the proxy's route to pass through.
    first = requests[0]
    assert first.query == "beta=true"
    assert first.headers["anthropic-version"] == "2023-06-01"
    assert first.headers["x-api-key"] == KEY
    assert first.headers["user-agent"].startswith(f"claude-cli/{pinned_version()} ")
    session = first.headers["x-claude-code-session-id"]
    assert all(r.headers["x-claude-code-session-id"] == session for r in requests)
    assert session in first.body["metadata"]["user_id"]
    assert "claude-code-20250219" in first.betas
    assert any(b.startswith("mid-conversation-") for b in first.betas)
    assert any(m["role"] == "system" for m in first.body["messages"])
    assert "Bash" in {tool["name"] for tool in first.body["tools"]}
    assert sum("cache_control" in block for block in first.body["system"]) >= 1

    # Sealed: nothing but loopback was ever connected.
    if strace_works():
        assert run.connections, "strace saw no connection at all"
        assert run.off_loopback() == [], run.off_loopback()


def test_the_fixture_refuses_a_remote_base_url(claude_code: ClaudeCode) -> None:
    with pytest.raises(ValueError, match="loopback only"):
        claude_code.environment("https://api.anthropic.com", KEY)
    assert claude_code.environment("http://127.0.0.1:1", KEY)["ANTHROPIC_BASE_URL"]
