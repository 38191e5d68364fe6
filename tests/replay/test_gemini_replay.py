"""A recorded Gemini session replays: its turns read back from the store are a trace (the wire
`gemini`, its route the model template), each sent to the proxy on the route naming its model,
answered by a native `gemini/` deployment with the recorded answers, and measured like any
other wire's (tokens received and sent, completion tokens, the cache's prefix)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.recording.sessions import recorded_turns
from proxy.replay.config import Served, replay_config
from proxy.replay.engine import replay
from proxy.replay.trace import check_turns
from proxy.sessions.identity import scoped
from proxy.state import RECORDINGS, STORE
from tests.conftest import ProxyFactory
from tests.wire.test_gemini import KEY, sim, start, upstream

__all__ = ["sim", "upstream"]  # fixtures
READ = {
    "functionDeclarations": [
        {
            "name": "read_file",
            "description": "Read a file",
            "parametersJsonSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
        }
    ]
}


async def record(proxy: TestServer) -> list[dict[str, Any]]:
    """Three turns of a native Gemini session with a tool round trip, as recorded."""
    url = proxy.make_url("/v1beta/models/gemini-native:generateContent")
    headers = {"x-goog-api-key": KEY, "x-agentproxy-session": "g1"}
    contents: list[dict[str, Any]] = [
        {"role": "user", "parts": [{"text": 'read_file({"path": "notes.txt"})'}]}
    ]
    async with aiohttp.ClientSession() as http:
        for turn in range(3):
            body = {"contents": contents, "tools": [READ]}
            async with http.post(url, json=body, headers=headers) as response:
                assert response.status == 200, await response.text()
                answer = await response.json()
            content = answer["candidates"][0]["content"]
            contents.append(content)
            calls = [p["functionCall"] for p in content["parts"] if "functionCall" in p]
            parts = [
                {"functionResponse": {"name": c["name"], "response": {"output": "x" * 3000}}}
                for c in calls
            ] or [{"text": f"and now step {turn}"}]
            contents.append({"role": "user", "parts": parts})
    turns: list[dict[str, Any]] = []
    for _ in range(200):
        await proxy.app[RECORDINGS].flush()
        turns = await recorded_turns(proxy.app[STORE], scoped("key:agent", "g1"))
        if len(turns) == 3:
            break
        await asyncio.sleep(0.01)
    return turns


async def test_a_recorded_gemini_session_replays(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer
) -> None:
    policies = "policies:\n  - name: kept\n    record: {enabled: true}\n"
    proxy = await start(start_proxy, tmp_path, upstream, policies=policies)
    turns = check_turns(await record(proxy), "session g1")
    assert [t["wire"] for t in turns] == ["gemini"] * 3
    assert any("functionCall" in str(t["answer"]) for t in turns)  # a tool round trip

    def served(url: str, folder: str) -> Served:
        return replay_config(turns, None, url, folder)

    rows = await replay(turns, served, policy="demo", session="g1")
    assert [row.status for row in rows] == [200, 200, 200], rows
    assert all(row.valid and row.wire == "gemini" for row in rows)
    assert all(row.tokens_received > 0 and row.tokens_sent > 0 for row in rows)
    assert all(row.completion_tokens > 0 for row in rows)
    # the history grows and the last turn's prefix is read from the cache
    assert rows[0].tokens_received < rows[1].tokens_received < rows[2].tokens_received
    assert rows[2].cache_read_tokens > 0
    # the demo policy offloads the large function responses
    assert any(r["stage"] == "offload" for row in rows for r in row.rewrites)
    assert rows[2].tokens_sent < rows[2].tokens_received
