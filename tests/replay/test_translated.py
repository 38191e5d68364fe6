"""A trace replayed with a configuration whose deployment speaks another wire than the
client (the proxy translating): the turn's one call gets an answer it can read, not the
trace's answer in the client's wire, so nothing is retried and each turn is one call."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from proxy import cli

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "examples" / "traces" / "coding-agent-anthropic.jsonl"


def test_a_translated_turn_is_one_call_not_a_retried_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text(
        textwrap.dedent(
            """\
            model_list:
              - model_name: claude-sonnet-4-5
                litellm_params: {model: openai/gpt-sim, api_base: "http://127.0.0.1:9/v1"}
                model_info: {max_input_tokens: 200000}
            """
        )
    )
    assert cli.main(["replay", str(TRACE), "--config", str(config), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["calls"]
    assert [r["upstream_calls"] for r in rows] == [1] * len(rows)
    assert not [w for r in rows for w in r["rewrites"] if w["stage"] == "retry"]
    assert all(r["valid"] and r["status"] == 200 and r["completion_tokens"] > 0 for r in rows)
