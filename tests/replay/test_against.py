"""`--against`: two policies over one trace, side by side, and the first turn they differ."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from proxy import cli

ROOT = Path(__file__).resolve().parents[2]
CHAT_TRACE = ROOT / "examples" / "traces" / "coding-agent-chat.jsonl"


def two_thresholds(path: Path) -> Path:
    """Two policies that differ only in the offload threshold: the trace's 300-token source
    files (first returned on turn 4) are offloaded by one, kept by the other."""
    path.write_text(
        textwrap.dedent(
            """\
            model_list:
              - model_name: gpt-4.1-mini
                litellm_params: {model: openai/gpt-4.1-mini, api_base: "http://127.0.0.1:9/v1"}
                model_info: {max_input_tokens: 8192}
            policies:
              - name: offload-500
                offload: {min_tokens: 500}
              - name: offload-250
                offload: {min_tokens: 250}
            """
        )
    )
    return path


def test_against_finds_the_first_turn_two_policies_send_differently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = two_thresholds(tmp_path / "policies.yaml")
    args = ["replay", str(CHAT_TRACE), "--config", str(config), "--json"]
    assert cli.main([*args, "--policy", "offload-500", "--against", "offload-250"]) == 0
    out = json.loads(capsys.readouterr().out)
    left, right = out["calls"], out["against"]["calls"]
    assert out["policy"] == "offload-500" and out["against"]["policy"] == "offload-250"
    assert out["against"]["first_difference"] == 4
    for a, b in zip(left[:3], right[:3], strict=True):
        assert (a["tokens_sent"], a["rewrites"]) == (b["tokens_sent"], b["rewrites"])
    # The lower threshold offloads the three files turn 4 returns: less is sent.
    assert right[3]["tokens_sent"] < left[3]["tokens_sent"]
    offloaded = [r for r in right[3]["rewrites"] if r["action"] == "offloaded"]
    assert offloaded[0]["count"] == 4

    # One policy against itself: no difference, said so.
    assert cli.main([*args, "--policy", "offload-500", "--against", "offload-500"]) == 0
    assert json.loads(capsys.readouterr().out)["against"]["first_difference"] is None


def test_the_text_report_marks_the_first_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = two_thresholds(tmp_path / "policies.yaml")
    code = cli.main(["replay", str(CHAT_TRACE), "--config", str(config),
                     "--policy", "offload-500", "--against", "offload-250"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "first call sent differently: 4" in out
    assert "[offload-500] 3 turns, 9 calls" in out and "[offload-250] 3 turns, 9 calls" in out


def test_against_default_with_a_config_is_what_no_policy_selects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`default` names the policy a configuration falls back to, though no entry of its own
    is called that, even for a key its policies are bound to."""
    config = tmp_path / "policies.yaml"
    config.write_text(
        textwrap.dedent(
            """\
            keys:
              api_keys: [{name: agent, key: sk-agent}]
            model_list:
              - model_name: gpt-4.1-mini
                litellm_params: {model: openai/gpt-4.1-mini, api_base: "http://127.0.0.1:9/v1"}
                model_info: {max_input_tokens: 8192}
            policies:
              - name: offload-250
                match: {keys: [agent]}
                offload: {min_tokens: 250}
            """
        )
    )
    args = ["replay", str(CHAT_TRACE), "--config", str(config), "--json"]
    assert cli.main([*args, "--against", "default"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "offload-250" and out["against"]["policy"] == "default"
    assert out["against"]["first_difference"] == 4
    # The defaults offload only above their own threshold: the 300-token files stay.
    offloaded = [
        sum(w["count"] for t in o["calls"] for w in t["rewrites"] if w["action"] == "offloaded")
        for o in (out, out["against"])
    ]
    assert offloaded[0] > offloaded[1] > 0, offloaded
    assert out["totals"]["all_valid"] and out["against"]["totals"]["all_valid"]
    assert cli.main([*args, "--policy", "default"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "default"
