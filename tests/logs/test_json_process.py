"""`server.log_format: json` for the whole process: every line a real `agentproxy serve` writes,
on stdout and stderr, from its start banner to its exit, is one JSON object. litellm's loggers
write through the process's handlers too."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

import openai
import orjson

from proxy.upstream.litellm import LITELLM_LOGGERS, _log_through_ours
from tests.conftest import free_port
from tests.test_cli import ROOT, wait_ready


async def test_every_line_of_a_json_process_is_one_json_object(
    simulator: str, tmp_path: Path
) -> None:
    config = tmp_path / "agentproxy.yaml"
    config.write_text(
        f"""\
server: {{log_format: json, access_log: true}}
store: {{path: {tmp_path / "state"}}}
model_list:
  - model_name: sim
    litellm_params: {{model: openai/sim, api_base: "{simulator}/v1"}}
  - model_name: claude        # chat to an Anthropic deployment: through litellm
    litellm_params: {{model: anthropic/claude-sim, api_base: "{simulator}", api_key: sk-sim}}
"""
    )
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, deadline=15, process=process)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="local", max_retries=0)
        for model in ("sim", "claude"):
            await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}]
            )
        process.send_signal(signal.SIGHUP)  # a reload says so
        await asyncio.sleep(0.3)
    finally:
        process.terminate()
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=20)
    assert process.returncode == 0, stderr.decode()
    records = {}
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        lines = text.decode().splitlines()
        assert lines, f"nothing on {name}"
        for line in lines:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                raise AssertionError(f"not JSON on {name}: {line!r}") from None
            assert isinstance(record, dict) and {"at", "level", "message"} <= set(record), line
        records[name] = [orjson.loads(line) for line in lines]
    (banner,) = records["stdout"]
    assert f"on http://127.0.0.1:{port}/v1 (config " in banner["message"]
    assert banner["level"] == "info" and banner["logger"] == "agentproxy"
    access = [r for r in records["stderr"] if r.get("logger") == "agentproxy.access"]
    assert [r["model"] for r in access if r["path"] == "/v1/chat/completions"] == ["sim", "claude"]


def test_litellms_loggers_write_through_the_process_handlers() -> None:
    own = logging.StreamHandler()
    own.addFilter(secret := logging.Filter("kept"))
    logger = logging.getLogger(LITELLM_LOGGERS[0])
    logger.addHandler(own)  # as `import litellm` does
    try:
        _log_through_ours()
        assert own not in logger.handlers and secret in logger.filters
    finally:
        logger.removeHandler(own)
        logger.removeFilter(secret)
