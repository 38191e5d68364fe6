"""`agentproxy replay` as a user runs it: a process, on the shipped traces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def agentproxy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_replay_prints_json_with_turns_and_totals() -> None:
    done = agentproxy("replay", "examples/traces/coding-agent-anthropic.jsonl", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no progress bar, no log lines: stderr is not a terminal
    out = json.loads(done.stdout)
    assert out["policy"] == "demo" and len(out["calls"]) == 9
    row = out["calls"][1]
    assert set(row) >= {
        "call", "turn", "tokens_received", "tokens_sent", "rewrites", "cache_hit_ratio",
        "cache_read_tokens", "cache_write_tokens", "cost_usd", "valid",
    }  # fmt: skip
    assert row["tokens_sent"] < row["tokens_received"]
    totals = out["totals"]
    # Three prompts, the first and last answered through tool rounds: 3 turns in 9 calls.
    assert [(r["call"], r["turn"]) for r in out["calls"]] == [
        (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (7, 2), (8, 3), (9, 3)
    ]  # fmt: skip
    assert (totals["turns"], totals["calls"]) == (3, 9) and totals["all_valid"]
    assert totals["summarizer_calls"] >= 1 and totals["rewrites"]["offload.offloaded"] >= 1
    # Anthropic prices cache writes: the cost counts them, and reads at a tenth of the input.
    assert totals["cache_write_tokens"] > 0 and totals["cost_usd"] > 0
    assert 0 < totals["cache_hit_ratio"] < 1


def test_replay_prints_a_table_and_totals() -> None:
    done = agentproxy("replay", "examples/traces/coding-agent-responses.jsonl",
                      "--policy", "default")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "replay of examples/traces/coding-agent-responses.jsonl with policy default" in (
        done.stdout
    )
    assert "[default] 3 turns, 9 calls: tokens received" in done.stdout
    assert "every request valid" in done.stdout


def test_a_bad_trace_exits_2_with_the_line() -> None:
    done = agentproxy("replay", "pyproject.toml")
    assert done.returncode == 2
    assert "agentproxy replay: pyproject.toml:1: not JSON" in done.stderr


def test_a_long_replay_shows_a_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    import os
    import pty

    turn = {"wire": "chat", "request": {"model": "m", "messages": [
        {"role": "user", "content": "hi"}]}}  # fmt: skip
    trace = tmp_path / "long.jsonl"
    trace.write_text((json.dumps(turn) + "\n") * 25)
    leader, follower = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "proxy", "replay", str(trace)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=follower, text=True,
    ) as process:  # fmt: skip
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the process left: the terminal is gone
                break
            if not chunk:
                break
            shown += chunk
        assert process.wait(timeout=120) == 0
        assert process.stdout is not None and "1 turn, 25 calls" in process.stdout.read()
    os.close(leader)
    assert b"replaying" in shown
    # The same replay with --json, or with stderr not a terminal, draws nothing.
    assert agentproxy("replay", str(trace), "--json").stderr == ""
    assert agentproxy("replay", str(trace)).stderr == ""


def test_an_unpriced_model_costs_a_dash_not_zero(tmp_path: Path) -> None:
    trace = (ROOT / "examples/traces/coding-agent-chat.jsonl").read_text()
    unpriced = tmp_path / "unpriced.jsonl"
    unpriced.write_text(trace.replace('"model": "gpt-4.1-mini"', '"model": "my-local-model"'))
    done = agentproxy("replay", str(unpriced))
    assert done.returncode == 0, done.stderr
    assert "cost \N{EN DASH}," in done.stdout and "$0.0000" not in done.stdout, done.stdout
    data = json.loads(agentproxy("replay", str(unpriced), "--json").stdout)
    assert data["totals"]["cost_usd"] is None


def test_several_traces_each_get_a_report_then_their_total() -> None:
    chat, responses = (f"examples/traces/coding-agent-{w}.jsonl" for w in ("chat", "responses"))
    done = agentproxy("replay", chat, responses, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [r["source"] for r in out["replays"]] == [chat, responses]
    alone = [json.loads(agentproxy("replay", path, "--json").stdout) for path in (chat, responses)]
    for each, single in zip(out["replays"], alone, strict=True):
        assert each["totals"] == single["totals"]  # as if replayed on its own
    for name in ("turns", "calls", "tokens_received", "tokens_sent", "summarizer_calls"):
        assert out["totals"][name] == sum(s["totals"][name] for s in alone), name
    assert out["totals"]["all_valid"]

    text = agentproxy("replay", chat, responses).stdout
    assert f"replay of {chat} with policy demo" in text
    assert f"replay of {responses} with policy demo" in text
    assert "total of 2 traces:\n[demo] 6 turns, 18 calls: tokens received" in text

    # A bad file among them: refused by its line before anything is replayed.
    bad = agentproxy("replay", chat, "pyproject.toml")
    assert bad.returncode == 2 and bad.stdout == ""
    assert "agentproxy replay: pyproject.toml:1: not JSON" in bad.stderr


def test_a_title_request_in_a_hand_written_trace_is_a_side_call_not_a_turn(
    tmp_path: Path,
) -> None:
    main = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": "list the files here"},
    ]
    title = [
        {"role": "system", "content": "You are a title generator."},
        {"role": "user", "content": "Generate a title for this conversation"},
    ]
    then = [*main, {"role": "assistant", "content": "README.md"},
            {"role": "user", "content": "and the tests?"}]  # fmt: skip
    trace = tmp_path / "side.jsonl"
    trace.write_text("".join(
        json.dumps({"wire": "chat", "request": {"model": "gpt-4.1-mini", "messages": m}}) + "\n"
        for m in (main, title, then)
    ))  # fmt: skip
    done = agentproxy("replay", str(trace), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [(r["turn"], r["opens"], r["side"]) for r in out["calls"]] == [
        (1, True, False), (1, False, True), (2, True, False)
    ]  # fmt: skip
    assert (out["totals"]["turns"], out["totals"]["calls"]) == (2, 3)
    table = agentproxy("replay", str(trace)).stdout
    assert "1 side" in table and "2 turns, 3 calls" in table, table
