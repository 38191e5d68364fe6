"""The real Claude Code and Codex CLIs through the proxy, recorded: one prompt is one client
turn however many calls the CLI makes for it (the tool round trip's calls continue the turn),
and each call reads as a conversation: the prompt, the shell call, its result, the answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.sim import Simulator, run_simulator
from proxy.state import RECORDINGS
from tests.conftest import ProxyFactory
from tests.support.sim_responders import ToolRoundTrip

from . import test_codex_proxy as codex_proxy
from .conftest import ClaudeCode, Codex
from .test_claude_code_proxy import PROXY_KEY, UPSTREAM_KEY, proxy_for

RECORDED = "policies:\n  - name: agent\n    record: {enabled: true}\n"


async def sessions(proxy: TestServer, key: str = PROXY_KEY) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url("/admin/sessions"), headers=headers) as r:
            listed = (await r.json())["data"]
        found = []
        for row in listed:
            async with http.get(proxy.make_url(f"/admin/sessions/{row['id']}"),
                                headers=headers) as r:  # fmt: skip
                found.append(await r.json())
        return found


def calls_a_tool(row: dict[str, Any]) -> bool:
    answer = row["answer"] or {"parts": []}
    return any(p["type"] == "tool_call" for p in answer["parts"])


async def test_claude_codes_prompt_is_one_turn_of_several_calls_read_as_a_conversation(
    claude_code: ClaudeCode, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=200_000, api_key=UPSTREAM_KEY, responder=ToolRoundTrip())
    async with run_simulator(sim) as url:
        proxy = await proxy_for(start_proxy, tmp_path, url, window=200_000, policy=RECORDED)
        base = str(proxy.make_url("")).rstrip("/")
        run = await claude_code.run("list the files here", base_url=base, api_key=PROXY_KEY)
        await proxy.app[RECORDINGS].flush()
        found = await sessions(proxy)
    assert run.exit_code == 0, run.stderr
    one_turn_of_calls(found, "Bash")


def one_turn_of_calls(found: list[dict[str, Any]], tool: str) -> None:
    """The session that called the tool: one turn of several calls, the call that made the
    tool call holding the prompt, the next one the tool's result and the answer."""
    (main,) = [s for s in found if any(map(calls_a_tool, s["timeline"]))]
    rows = main["timeline"]
    assert main["calls"] >= 2 and main["turns"] == 1, [(r["call"], r["turn"]) for r in rows]
    called = next(r for r in rows if calls_a_tool(r))
    (bash,) = [p for p in called["answer"]["parts"] if p["type"] == "tool_call"]
    assert bash["name"] == tool and isinstance(bash["arguments"], dict)
    prompts = [p.get("text", "") for m in called["messages_in"] if m["role"] == "user"
               for p in m["parts"]]  # fmt: skip
    assert any("list the files here" in t for t in prompts), prompts
    after = rows[rows.index(called) + 1]
    assert after["opens"] is False
    results = [p for m in after["messages_in"] for p in m["parts"] if p["type"] == "tool_result"]
    assert results and results[0]["id"] == bash["id"]
    assert after["answer"]["parts"] and after["error"] is None


async def test_codexs_prompt_is_one_turn_of_several_calls_read_as_a_conversation(
    codex: Codex, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    responder = codex_proxy.codex_shell_round_trip()
    sim = Simulator(context_window=400_000, api_key=codex_proxy.UPSTREAM_KEY, responder=responder)
    async with run_simulator(sim) as url:
        proxy = await codex_proxy.proxy_for(
            start_proxy, tmp_path, url, window=400_000, policy=RECORDED
        )
        base = str(proxy.make_url("")).rstrip("/")
        run = await codex.run("list the files here", base_url=base, api_key=codex_proxy.PROXY_KEY)
        await proxy.app[RECORDINGS].flush()
        found = await sessions(proxy, codex_proxy.PROXY_KEY)
    assert run.exit_code == 0, run.stderr
    one_turn_of_calls(found, "exec_command")
