"""Replay counts the summaries the proxy writes ahead of the compaction trigger
(compaction.prepare_at): prepared, used by the turn that crosses it, wasted when none does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy import cli

PROSE = "The parser reads each line of the input file and splits it on commas. " * 34


def growing(turns: int) -> list[dict[str, Any]]:
    """A chat session whose history grows ~600 tokens a turn, in the demo's 8,192-token
    window: past prepare_at (0.75 of the trigger) near turn 8, past the trigger near 11."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    lines = []
    for n in range(1, turns + 1):
        history.append({"role": "user", "content": f"Step {n}: look at src/mod{n}.py.\n{PROSE}"})
        lines.append({"wire": "chat", "request": {"model": "gpt-4.1-mini", "messages": history}})
        history = [*history, {"role": "assistant", "content": f"mod{n} parses lines."}]
    return lines


def write(path: Path, lines: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_prepared_used_and_wasted_summaries_are_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = growing(16)
    crossed = write(tmp_path / "crossed.jsonl", session)
    # The same session, stopped after a summary was prepared and before a turn crossed.
    out = json.loads(_replay(capsys, crossed, "--json"))
    crossing = next(
        t["call"] for t in out["calls"] if any(r["action"] == "summarized" for r in t["rewrites"])
    )
    stopped = write(tmp_path / "stopped.jsonl", session[: crossing - 1])

    out = json.loads(_replay(capsys, crossed, stopped, "--json"))
    used, wasted = (r["totals"] for r in out["replays"])
    # The crossing took the summary prepared for it; the next one, prepared after it, was
    # left when the session ended.
    assert (used["summaries_prepared"], used["summaries_used"], used["summaries_wasted"]) == (
        2, 1, 1)  # fmt: skip
    [took] = [t["call"] for t in out["replays"][0]["calls"] if t["summaries_used"]]
    assert took == crossing
    assert (wasted["summaries_prepared"], wasted["summaries_used"]) == (1, 0)
    assert wasted["summaries_wasted"] == 1  # the session ended before its crossing
    assert out["totals"]["summaries_prepared"] == 3 and out["totals"]["summaries_wasted"] == 2

    text = _replay(capsys, crossed)
    assert "summaries prepared ahead 2 (used 1, wasted 1)" in text


def _replay(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main(["replay", *args]) == 0, capsys.readouterr().err
    return capsys.readouterr().out
