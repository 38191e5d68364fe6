"""Input replay cannot run gets a clear error, naming the line, before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy import cli

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
        ("[1, 2]", "a turn is a JSON object"),
        (
            json.dumps({**GOOD, "wire": "grpc"}),
            "unknown wire 'grpc'; one of chat, anthropic, responses",
        ),
        (json.dumps({"request": GOOD["request"]}), 'no "wire"'),
        (json.dumps({"wire": "chat"}), '"request" must be the client\'s JSON body'),
        (json.dumps({**GOOD, "request": {"messages": []}}), "the request names no model"),
        (json.dumps({**GOOD, "route": "/v1/messages"}), "is not the chat wire's"),
        (json.dumps({**GOOD, "answer": "ok"}), '"answer" must be'),
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
    assert code == 2 and f"{trace}: no turns" in capsys.readouterr().err
    assert cli.main(["replay"]) == 2
    assert "give a trace FILE.jsonl or --session ID" in capsys.readouterr().err
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
    stays valid; a thinking block whose signature the provider did not make goes upstream as
    it came, and the provider refuses it: that turn is marked invalid."""
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
    ]}}  # fmt: skip
    code, _ = replay_file(tmp_path, [json.dumps(orphan), json.dumps(forged)], "--json")
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    first, second = out["turns"]
    assert first["valid"] and any(r["stage"] == "repair" for r in first["rewrites"])
    assert not second["valid"] and second["status"] == 400
    assert out["totals"]["all_valid"] is False and out["totals"]["invalid_turns"] == [2]
