"""Input replay cannot run gets a clear error, naming the line, before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proxy import cli
from proxy.replay.trace import MAX_LINE_BYTES
from tests.support.agentproxy_run import ROOT

# Runs `agentproxy replay ARGS` as its only child and prints that child's peak RSS (KiB) last.
MEASURED = """
import resource, subprocess, sys
code = subprocess.run([sys.executable, "-m", "proxy", "replay", *sys.argv[1:]]).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""

GOOD = {"wire": "chat", "request": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}


def replay_file(tmp_path: Path, lines: list[str], *flags: str) -> tuple[int, str]:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    code = cli.main(["replay", str(trace), *flags])
    return code, str(trace)


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "a call is a JSON object"),
        (
            json.dumps({**GOOD, "wire": "grpc"}),
            "unknown wire 'grpc'; one of chat, anthropic, responses",
        ),
        (json.dumps({"request": GOOD["request"]}), 'no "wire"'),
        (json.dumps({"wire": "chat"}), '"request" must be the client\'s JSON body'),
        (json.dumps({**GOOD, "request": {"messages": []}}), "the request names no model"),
        (json.dumps({**GOOD, "route": "/v1/messages"}), "is not the chat wire's"),
        (json.dumps({**GOOD, "answer": "ok"}), '"answer" must be'),
        (json.dumps({**GOOD, "status": "ok"}), '"status" must be the HTTP status'),
        (json.dumps({**GOOD, "status": 42}), '"status" must be the HTTP status'),
        (json.dumps({**GOOD, "turn": 0}), '"turn" must be the client turn\'s number'),
        (json.dumps({**GOOD, "turn": "1"}), '"turn" must be the client turn\'s number'),
        (json.dumps({**GOOD, "opens": 1}), '"opens" must be true or false'),
        (json.dumps({**GOOD, "headers": ["a"]}), '"headers" must map header names to strings'),
        (json.dumps({**GOOD, "headers": {"a": 1}}), '"headers" must map header names'),
        (json.dumps({**GOOD, "headers": {"Authorization": "Bearer x"}}), "replay's own"),
        (json.dumps({**GOOD, "headers": {"x-agentproxy-policy": "p"}}), "replay's own"),
        (json.dumps({**GOOD, "headers": {"a": "b\r\nc: d"}}), "a control character"),
    ],
)
def test_a_bad_line_is_named_by_its_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str, said: str
) -> None:
    code, trace = replay_file(tmp_path, [json.dumps(GOOD), "", bad])
    err = capsys.readouterr().err
    assert code == 2
    assert f"agentproxy replay: {trace}:3: " in err and said in err


def test_an_unknown_policy_is_refused_naming_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = replay_file(tmp_path, [json.dumps(GOOD)], "--policy", "nope")
    assert code == 2
    assert "unknown policy 'nope'; one of demo, default" in capsys.readouterr().err
    code, _ = replay_file(tmp_path, [json.dumps(GOOD)], "--against", "nope")
    assert code == 2 and "unknown policy 'nope'" in capsys.readouterr().err


def test_missing_empty_and_ambiguous_sources(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["replay", str(tmp_path / "absent.jsonl")]) == 2
    assert "absent.jsonl: cannot read" in capsys.readouterr().err
    code, trace = replay_file(tmp_path, [""])
    assert code == 2 and f"{trace}: no calls" in capsys.readouterr().err
    assert cli.main(["replay"]) == 2
    assert "give a trace FILE.jsonl (or several) or --session ID" in capsys.readouterr().err
    assert cli.main(["replay", trace, "--session", "s1"]) == 2
    assert "give a trace FILE.jsonl (or several) or --session ID" in capsys.readouterr().err
    assert cli.main(["replay", "--session", "s1"]) == 2
    assert "--session needs --config" in capsys.readouterr().err
    code, _ = replay_file(tmp_path, [json.dumps(GOOD)], "--key", "k")
    assert code == 2 and "--key needs --config" in capsys.readouterr().err
    code, _ = replay_file(tmp_path, [json.dumps(GOOD)], "--live", "big")
    assert code == 2 and "--live needs --config" in capsys.readouterr().err


def test_a_request_the_provider_would_refuse_is_reported_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tool result answering no call: the proxy's repair notes it, and what goes upstream
    stays valid; a thinking block the provider refused live (its signature forged) goes
    upstream as it came, and is refused again: that turn is marked invalid. (What a turn
    answered live carries, its signed blocks, the replay's provider takes as its own.)"""
    orphan = {"wire": "chat", "request": {"model": "m", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "call_x", "content": "stray"},
    ]}}  # fmt: skip
    forged = {"wire": "anthropic", "request": {"model": "c", "max_tokens": 100, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "Zm9yZ2Vk"},
            {"type": "text", "text": "hello"}]},
        {"role": "user", "content": "again"},
    ]}, "status": 400}  # fmt: skip
    code, _ = replay_file(tmp_path, [json.dumps(orphan), json.dumps(forged)], "--json")
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    first, second = out["calls"]
    assert first["valid"] and any(r["stage"] == "repair" for r in first["rewrites"])
    assert not second["valid"] and second["status"] == 400
    # What the provider said, not only that it refused.
    refused = "/v1/messages answered 400: messages.1.content.0: Invalid `signature`"
    assert any(p.startswith(refused) for p in second["problems"]), second["problems"]
    assert out["totals"]["all_valid"] is False and out["totals"]["invalid_calls"] == [2]


def replay_as_a_user(trace: str) -> tuple[int, list[str], int]:
    """`agentproxy replay TRACE` in a process of its own: its exit code, the lines it printed
    on stderr, its peak resident memory in MB. Bounded: a read that does not stop fails."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURED, trace],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    *said, peak_kib = done.stderr.splitlines()
    return done.returncode, said, int(peak_kib) // 1024


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, ":1: not a text file (a NUL byte)"),
        (json.dumps(GOOD).encode() + b"\n\x00\x01\x02", ":2: not a text file (a NUL byte)"),
        (bytes(range(128, 256)) * 64, ":1: not a text file (not UTF-8 at byte 0)"),
    ],
)
def test_a_trace_that_is_not_text_is_refused_in_one_line_at_once(
    tmp_path: Path, content: bytes | None, said: str
) -> None:
    trace = "/dev/zero"  # endless: read whole it grew to gigabytes
    if content is not None:
        trace = str(tmp_path / "binary.jsonl")
        Path(trace).write_bytes(content)
    code, lines, peak_mb = replay_as_a_user(trace)
    assert code == 2
    assert lines == [f"agentproxy replay: {trace}{said}: a trace is JSON lines"]
    assert peak_mb < 150


def test_a_line_past_the_limit_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    trace = tmp_path / "long.jsonl"
    with trace.open("wb") as file:  # one 150 MB line: read whole it took 356 MB
        file.write(b'{"wire": "chat", "padding": "')
        file.write(b"a" * (150 * 1024 * 1024))
        file.write(b'"}\n')
    code, lines, peak_mb = replay_as_a_user(str(trace))
    assert code == 2
    assert lines == [f"agentproxy replay: {trace}:1: a line longer than {MAX_LINE_BYTES} bytes"]
    assert peak_mb < 200  # the process (~55 MB) and at most one line's limit (64 MB)


def test_a_control_character_in_a_model_name_is_a_clear_error(tmp_path: Path) -> None:
    """It would go into the proxy's response headers, which refuse it mid-answer."""
    turn = {**GOOD, "request": {**GOOD["request"], "model": "gp\u0000t"}}
    trace = tmp_path / "nul-model.jsonl"
    trace.write_text(json.dumps(GOOD) + "\n" + json.dumps(turn) + "\n")
    code, lines, _ = replay_as_a_user(str(trace))
    assert code == 2
    assert lines == [
        f"agentproxy replay: {trace}:2: the request's model name holds a control character "
        "(U+0000): 'gp\\x00t'"
    ]


def test_a_turn_whose_status_differs_from_the_live_one_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [json.dumps({**GOOD, "status": 200}), json.dumps({**GOOD, "status": 502})]
    code, _ = replay_file(tmp_path, lines, "--json")
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    first, second = out["calls"]
    assert (first["live_status"], first["problems"]) == (200, [])
    assert second["live_status"] == 502
    assert second["problems"] == ["the client got 200, 502 live"]
    code, _ = replay_file(tmp_path, lines)
    assert "call 2: the client got 200, 502 live" in capsys.readouterr().out


def test_a_turn_recorded_without_its_headers_gets_those_its_request_implies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Claude Code's `role: "system"` entries inside messages came with its mid-conversation
    beta (the provider refuses them without one): a recording made before recordings kept
    headers replays valid; a trace that says it sent none (`{}`) is refused as it would be."""
    turn = {"wire": "anthropic", "status": 200, "request": {"model": "c", "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "system", "content": "the tools changed"},
                     {"role": "user", "content": "again"}]}}  # fmt: skip
    code, _ = replay_file(tmp_path, [json.dumps(turn)], "--json")
    [row] = json.loads(capsys.readouterr().out)["calls"]
    assert code == 0 and row["valid"] and row["status"] == 200, row["problems"]
    code, _ = replay_file(tmp_path, [json.dumps({**turn, "headers": {}})], "--json")
    [row] = json.loads(capsys.readouterr().out)["calls"]
    assert not row["valid"] and row["status"] == 400
    assert "messages.1.role: Input should be 'user' or 'assistant'" in row["problems"][0]
