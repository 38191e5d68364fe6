"""`server.log_format: json`: one parseable line per request saying who, what, what the proxy
did and what it cost, and never a secret or a word of the conversation. Over real sockets."""

from __future__ import annotations

import logging
from pathlib import Path

import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.logs.lines import JsonLines
from tests.conftest import ProxyFactory, base_url, sim_config

KEY = "sk-alice-secret-0001"
SECRET_WORDS = "the launch code is 7-ALPHA-ZULU"


async def test_a_request_is_one_json_line_with_no_secret(
    start_proxy: ProxyFactory,
    sim_server: TestServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "json-logs.yaml"
    extra = f"""
server: {{log_format: json, access_log: true}}
store: {{path: {tmp_path / "state"}}}
keys:
  api_keys:
    - {{name: alice, key: {KEY}}}
"""
    path.write_text(sim_config(str(sim_server.make_url("")).rstrip("/"), extra))
    proxy = await start_proxy(path)
    client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key=KEY, max_retries=0)
    caplog.set_level(logging.INFO, logger="agentproxy.access")
    history = [
        {"role": "user", "content": SECRET_WORDS},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1")]},  # left dangling
        {"role": "user", "content": "go on"},
    ]
    await client.chat.completions.create(
        model="sim", messages=history, extra_headers={"x-agentproxy-session": "s-json"}
    )
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=history)
    lines = [JsonLines().format(r) for r in caplog.records if r.name == "agentproxy.access"]
    ok, missing = (orjson.loads(line) for line in lines)
    assert ok["status"] == 200 and ok["key"] == "alice" and ok["session"] == "s-json"
    assert ok["model"] == "sim" and ok["policy"] and ok["path"] == "/v1/chat/completions"
    assert ok["rewrites"] == ["repair.patched_dangling"] and ok["upstream_calls"] == 1
    assert ok["prompt_tokens"] > 0 and ok["completion_tokens"] > 0
    assert ok["duration_ms"] >= ok["proxy_ms"] > 0 and "cost_usd" in ok
    assert missing["status"] == 404 and len(missing["request_id"]) > 8
    for line in lines:
        assert KEY not in line and "launch code" not in line and "sk-sim" not in line


def _call(call_id: str) -> dict[str, object]:
    return {"id": call_id, "type": "function", "function": {"name": "ls", "arguments": "{}"}}
