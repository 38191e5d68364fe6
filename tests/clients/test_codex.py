"""The real Codex CLI against the strict Responses twin: a full tool round trip.

The fixture takes any loopback base URL; this test points it straight at the simulator (the
proxy's Responses route tests point the same fixture at the proxy).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.sim import RecordedRequest, Simulator, run_simulator
from proxy.sim.model import text_of
from tests.support.sim_responders import CODEX_SHELL_TOOL, codex_shell_round_trip

from .conftest import CODEX_MODEL, SCRATCH_FILES, Codex, pinned_version, strace_works

KEY = "sk-sim-codex"
JSON = dict[str, Any]


def shell_round_trip(request: RecordedRequest) -> tuple[JSON, JSON] | None:
    """(the exec_command function_call, the function_call_output answering it), if any."""
    items = request.body.get("input") or []
    calls = {
        item["call_id"]: item
        for item in items
        if item.get("type") == "function_call" and item.get("name") == CODEX_SHELL_TOOL
    }
    for item in items:
        if item.get("type") == "function_call_output" and item.get("call_id") in calls:
            return calls[item["call_id"]], item
    return None


def output_text(item: JSON) -> str:
    output = item.get("output")
    return output if isinstance(output, str) else text_of(output)


async def test_codex_runs_a_shell_round_trip(codex: Codex) -> None:
    sim = Simulator(context_window=400_000, api_key=KEY, responder=codex_shell_round_trip())
    async with run_simulator(sim) as url:
        run = await codex.run("list the files here", base_url=url, api_key=KEY, trace=True)
    assert run.exit_code == 0, run.stderr
    requests = [r for r in sim.requests if r.path == "/v1/responses"]
    assert requests, "Codex sent no Responses request"
    assert [r.path for r in sim.requests] == ["/v1/responses"] * len(sim.requests)
    assert [r.status for r in sim.requests] == [200] * len(sim.requests), "a request was refused"

    # The tool round trip: Codex ran `ls` for the exec_command call and sent back its output.
    trip = shell_round_trip(requests[-1])
    assert trip is not None, "no function_call_output for the exec_command call"
    call, result = trip
    assert orjson.loads(call["arguments"]) == {"cmd": "ls"}
    listing = output_text(result)
    assert all(name in listing for name in SCRATCH_FILES), listing
    assert "The command listed:" in run.stdout
    assert all(name in run.stdout for name in SCRATCH_FILES), run.stdout
    # It returned our sealed reasoning item before the call, which the twin verified.
    items = requests[-1].body["input"]
    reasoning = [item for item in items if item.get("type") == "reasoning"]
    assert reasoning and all(item.get("encrypted_content") for item in reasoning)

    # What it sends, for the proxy's route to pass through.
    first = requests[0]
    body = first.body
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert first.headers["originator"] == "codex_exec"
    assert first.headers["user-agent"].startswith(f"codex_exec/{pinned_version('@openai/codex')} ")
    assert first.headers["accept"] == "text/event-stream"
    session = first.headers["session-id"]
    assert all(r.headers["session-id"] == session for r in requests)
    assert first.headers["thread-id"] == session == body["prompt_cache_key"]
    assert body["model"] == CODEX_MODEL and body["stream"] is True and body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"]
    assert "instructions" not in body  # its prompt is a developer message in the input
    roles = [item.get("role") for item in body["input"] if item.get("type") == "message"]
    assert roles[0] == "developer" and roles[-1] == "user"
    assert body["client_metadata"]["session_id"] == session
    tools = {tool.get("name") or tool["type"]: tool for tool in body["tools"]}
    assert tools[CODEX_SHELL_TOOL]["type"] == "function"
    assert tools[CODEX_SHELL_TOOL]["parameters"]["required"] == ["cmd"]
    assert {tool["type"] for tool in body["tools"]} >= {"function", "namespace", "web_search"}

    # Sealed: nothing but loopback was ever connected.
    if strace_works():
        assert run.connections, "strace saw no connection at all"
        assert run.off_loopback() == [], run.off_loopback()


def test_the_fixture_refuses_a_remote_base_url(codex: Codex) -> None:
    with pytest.raises(ValueError, match="loopback only"):
        codex.environment("https://api.openai.com", KEY)
    config = codex.config("http://127.0.0.1:1")
    assert 'base_url = "http://127.0.0.1:1/v1"' in config
    assert 'wire_api = "responses"' in config
