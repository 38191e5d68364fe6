"""Replicas on one Redis list every session, recorded or not: a session no policy records, its
calls alternating between two replicas, is listed by both with every call and client turn
(from the store's index, `source: index`, `recorded: false`), opens by id on either with those
figures, and answers ?session=NAME; another key's session of the same name is its own; the
entry has no blobs, counts toward no owner's bytes and expires with the session's TTL."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import redis
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import REDIS_URL
from tests.test_replicas import proxies

ALICE, BOB, ADMIN = "sk-alice-board-0001", "sk-bob-board-00002", "sk-admin-board-0003"
TTL_S = 3600


def config(sim_url: str, prefix: str) -> str:
    return textwrap.dedent(
        f"""\
        store: {{backend: redis, url: "{REDIS_URL}", prefix: "{prefix}", session_ttl: {TTL_S}s}}
        keys:
          admin_key: {ADMIN}
          api_keys:
            - {{name: alice, key: {ALICE}}}
            - {{name: bob, key: {BOB}}}
        model_list:
          - model_name: sim
            litellm_params: {{model: openai/sim, api_base: {sim_url}/v1, api_key: sk-up}}
            model_info:
              max_input_tokens: 200000
              input_cost_per_token: 0.000002
              output_cost_per_token: 0.000008
        """
    )


async def call(url: str, key: str, session: str, messages: list[dict[str, Any]]) -> None:
    body = {"model": "sim", "messages": messages, "max_tokens": 16}
    headers = {"authorization": f"Bearer {key}", "x-agentproxy-session": session}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()


def conversation() -> list[list[dict[str, Any]]]:
    """Four calls, two client turns: a prompt, a tool result, a new prompt, a tool result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the first log."}]
    calls = [list(messages)]
    for n, prompt in ((0, "Now read the second one."), (1, None)):
        tool = {"id": f"call_{n}", "type": "function",
                "function": {"name": "read_log", "arguments": json.dumps({"n": n})}}  # fmt: skip
        messages.append({"role": "assistant", "content": None, "tool_calls": [tool]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": f"log {n}"})
        calls.append(list(messages))
        if prompt is not None:
            messages.append({"role": "assistant", "content": "Read."})
            messages.append({"role": "user", "content": prompt})
            calls.append(list(messages))
    return calls


async def get(url: str, path: str, key: str) -> Any:
    async with (
        aiohttp.ClientSession() as http,
        http.get(url + path, headers={"authorization": f"Bearer {key}"}) as response,
    ):
        assert response.status == 200, await response.text()
        return await response.json()


async def listed(url: str, key: str, calls: int, query: str = "") -> list[dict[str, Any]]:
    """The list once its rows hold `calls` calls between them, all from the index."""
    rows: list[dict[str, Any]] = []
    for _ in range(100):
        rows = (await get(url, "/admin/sessions" + query, key))["data"]
        if all(r["source"] == "index" for r in rows) and sum(r["calls"] for r in rows) >= calls:
            return rows
        await asyncio.sleep(0.05)
    raise AssertionError(f"the list never held {calls} calls from the index: {rows}")


FIGURES = ("session", "owner", "key", "model", "policy", "recorded", "turns", "calls",
           "tokens_received", "tokens_sent", "prompt_tokens", "completion_tokens", "cost_usd",
           "errors", "statuses", "first_at", "last_at", "source")  # fmt: skip


def figures(row: dict[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in FIGURES}


async def test_replicas_list_every_unrecorded_session_with_all_its_calls(
    aiohttp_server: Any, tmp_path: Path, redis_prefix: str
) -> None:
    upstream: TestServer = await aiohttp_server(Simulator(context_window=200_000).app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), redis_prefix))
    calls = conversation()
    async with proxies(path, 2) as (one, two):
        for n, messages in enumerate(calls):  # the session's calls alternate between them
            await call((one, two)[n % 2].url, ALICE, "shared", messages)
        await call(two.url, BOB, "shared", calls[0])  # the same name, another tenant's
        alices = [await listed(p.url, ALICE, len(calls)) for p in (one, two)]
        bobs = [await listed(p.url, BOB, 1) for p in (one, two)]
        everyone = await listed(one.url, ADMIN, len(calls) + 1)
        named = await listed(two.url, ALICE, len(calls), "?session=shared")
        inspector = f"/admin/sessions/{alices[0][0]['id']}"
        opened = [await get(p.url, inspector, ALICE) for p in (one, two)]

    assert [len(rows) for rows in alices] == [1, 1]
    alice = alices[0][0]
    assert figures(alice) == figures(alices[1][0]) == figures(named[0])
    assert (alice["session"], alice["key"], alice["recorded"], alice["source"]) == (
        "shared", "alice", False, "index",
    )  # fmt: skip
    assert (alice["calls"], alice["turns"], alice["statuses"]) == (4, 2, {"200": 4})
    sizes = sum(len(json.dumps({"model": "sim", "messages": m, "max_tokens": 16})) for m in calls)
    assert 0 < alice["tokens_received"] <= sizes // 4
    assert alice["prompt_tokens"] > 0 and alice["cost_usd"] > 0
    for header in opened:  # either replica's inspector: every replica's calls
        assert {k: header[k] for k in ("calls", "turns", "source")} == {
            "calls": 4, "turns": 2, "source": "index",
        }  # fmt: skip
    assert [len(rows) for rows in bobs] == [1, 1]
    bob = bobs[0][0]
    assert (bob["id"], bob["calls"], bob["key"]) == (bobs[1][0]["id"], 1, "bob")
    assert bob["id"] != alice["id"]
    assert sorted((r["owner"], r["calls"]) for r in everyone) == [
        (alice["owner"], 4), (bob["owner"], 1),
    ]  # fmt: skip

    client = redis.Redis.from_url(REDIS_URL)
    entry = f"{redis_prefix}listing:{alice['owner']}/shared"
    assert 0 < client.pttl(entry) <= TTL_S * 1000  # it expires with the session's TTL
    assert not client.exists(f"{redis_prefix}blobs:{alice['owner']}/shared")  # no blobs
    assert client.zscore(f"{redis_prefix}sessions", f"{alice['owner']}/shared") is None
    assert not client.hget(f"{redis_prefix}owners", alice["owner"])  # no bytes counted
