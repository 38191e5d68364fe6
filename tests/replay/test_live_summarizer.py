"""`--live ALIAS`: the summarizer is that alias of the configuration, called for real."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from proxy import cli
from proxy.replay import measure
from proxy.sim.simulator import Simulator

ROOT = Path(__file__).resolve().parents[2]
CHAT_TRACE = ROOT / "examples" / "traces" / "coding-agent-chat.jsonl"


async def test_live_calls_the_configured_summarizer(
    tmp_path: Path, aiohttp_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    summarizer = Simulator(context_window=200_000)
    server: TestServer = await aiohttp_server(summarizer.app())
    config = tmp_path / "proxy.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            model_list:
              - model_name: gpt-4.1-mini
                litellm_params: {{model: openai/gpt-4.1-mini, api_base: "http://127.0.0.1:9/v1"}}
                model_info: {{max_input_tokens: 8192}}
              - model_name: big
                litellm_params: {{model: openai/big, api_base: "{server.make_url("/v1")}"}}
                model_info: {{max_input_tokens: 200000}}
            policies:
              - {{name: small, offload: {{min_tokens: 500}}}}
            """
        )
    )
    args = ["replay", str(CHAT_TRACE), "--config", str(config), "--json", "--live", "big"]
    assert await asyncio.to_thread(cli.main, args) == 0
    out = json.loads(capsys.readouterr().out)
    asked = [r for r in summarizer.requests if measure.is_summary(r.path, r.body)]
    assert asked and all(r.body["model"] == "big" for r in asked)
    assert out["totals"]["summarizer_calls"] == 0  # none answered by the stand-in
    assert any(name.startswith("compaction.") for name in out["totals"]["rewrites"])

    assert await asyncio.to_thread(cli.main, [*args[:-1], "nope"]) == 2
    assert "--live nope: no such alias" in capsys.readouterr().err
