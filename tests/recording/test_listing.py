"""Recorded sessions outlive the process: the store's index of them (proxy/store/listing.py)
lists them after a restart, on every replica of one Redis, each tenant its own (a second key
sending the same session name gets its own entry), and opens them by name, with their tokens
and cost. The list's context tokens are replay's measure: a session recorded through the proxy
and replayed with `agentproxy replay --session` gives the same totals."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from proxy import cli
from proxy.replay.config import built_in
from proxy.replay.trace import read_trace
from proxy.sim.simulator import Simulator
from proxy.state import RECORDINGS
from tests.conftest import REDIS_URL, ProxyFactory
from tests.replay.test_live import TRACES, TraceUpstream, _send
from tests.test_replicas import proxies

ALICE, BOB, ADMIN = "sk-alice-listing-1", "sk-bob-listing-02", "sk-admin-listing-3"
LINES = "".join(f"line {n}: some output of the tool\n" for n in range(300))  # ~2,800 tokens


def config(sim_url: str, store: str) -> str:
    return textwrap.dedent(
        f"""\
        store: {{{store}}}
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
        policies:
          - name: recorded
            record: {{enabled: true}}
            offload: {{min_tokens: 500}}
        """
    )


@pytest.fixture(params=["local", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    where = f"path: {tmp_path / 'data'}"
    if request.param == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        return f'{where}, backend: redis, url: "{REDIS_URL}", prefix: "{prefix}"'
    return where


async def write_config(aiohttp_server: Any, tmp_path: Path, store: str) -> Path:
    upstream: TestServer = await aiohttp_server(Simulator(context_window=200_000).app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), store))
    return path


async def converse(url: str, key: str, session: str, turns: int, start: int = 0) -> None:
    """`turns` turns of one agent session, each a tool call and its large result more (the
    proxy offloads it: sent upstream is less than received)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the logs, one by one."}]
    for n in range(start):
        _step(messages, n)
    async with aiohttp.ClientSession() as http:
        for n in range(start, start + turns):
            _step(messages, n)
            body = {"model": "sim", "messages": messages, "max_tokens": 32}
            headers = {"authorization": f"Bearer {key}", "x-agentproxy-session": session}
            async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200, await r.text()


def _step(messages: list[dict[str, Any]], n: int) -> None:
    call = {"id": f"call_{n}", "type": "function",
            "function": {"name": "read_log", "arguments": json.dumps({"n": n})}}  # fmt: skip
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": f"log {n}\n{LINES}"})


async def get(url: str, path: str, key: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(url + path, headers={"authorization": f"Bearer {key}"}) as response,
    ):
        return response.status, await response.json()


async def listed(url: str, key: str, query: str = "", turns: int = 0) -> list[dict[str, Any]]:
    """The list, once its sessions have `turns` turns between them, each listed from its
    recording (the writer lingers a moment before it writes; the board lists a session
    meanwhile)."""
    for _ in range(200):
        status, body = await get(url, "/admin/sessions" + query, key)
        assert status == 200, body
        rows: list[dict[str, Any]] = body["data"]
        written = all(row["source"] == "recording" for row in rows)
        if written and sum(row["calls"] for row in rows) >= turns:
            return rows
        await asyncio.sleep(0.05)
    raise AssertionError(f"the list never held {turns} turns: {rows}")


FIGURES = ("turns", "calls", "tokens_received", "tokens_sent", "prompt_tokens", "completion_tokens",
           "cost_usd", "errors", "first_at", "last_at", "not_recorded", "key", "model")  # fmt: skip


def figures(row: dict[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in FIGURES}


async def test_recorded_sessions_are_listed_and_open_by_name_after_a_restart(
    aiohttp_server: Any, tmp_path: Path, store: str
) -> None:
    path = await write_config(aiohttp_server, tmp_path, store)
    async with proxies(path, 1) as (first,):
        await converse(first.url, ALICE, "s1", 3)
        await converse(first.url, ALICE, "s2", 1)
        await converse(first.url, BOB, "s1", 2)  # the same name, another tenant's session
        before = {row["id"]: row for row in await listed(first.url, ADMIN, turns=6)}
    assert len(before) == 3

    async with proxies(path, 1) as (second,):  # a new process: an empty board
        alices = await listed(second.url, ALICE)
        bobs = await listed(second.url, BOB)
        everyone = await listed(second.url, ADMIN)
        named = await listed(second.url, ALICE, "?session=s1")
        status, opened = await get(second.url, f"/admin/sessions/{named[0]['id']}", ALICE)
        refused, _ = await get(second.url, f"/admin/sessions/{named[0]['id']}", BOB)

    assert {row["id"]: figures(row) for row in everyone} == {
        ident: figures(row) for ident, row in before.items()
    }
    described = [(r["session"], r["calls"], r["key"]) for r in alices]
    assert described == [("s2", 1, "alice"), ("s1", 3, "alice")]
    assert [(r["session"], r["calls"], r["key"]) for r in bobs] == [("s1", 2, "bob")]
    alice_s1 = next(r for r in alices if r["session"] == "s1")
    assert bobs[0]["id"] != alice_s1["id"]
    for row in [*alices, *bobs]:
        assert row["recorded"] and row["errors"] == 0 and row["not_recorded"] == {}
        assert row["tokens_sent"] < row["tokens_received"]  # the offloads
        assert row["cost_usd"] > 0 and row["prompt_tokens"] > 0
        assert row["statuses"] == {"200": row["calls"]} and row["turns"] == 1
    # By name: the caller's own session of that name, however many tenants use it.
    assert [r["id"] for r in named] == [alice_s1["id"]]
    assert status == 200 and opened["source"] == "recording"
    assert figures(opened) == figures(alice_s1)
    assert len(opened["timeline"]) == 3
    assert refused == 404  # another tenant's id is an unknown one


async def test_every_replica_lists_the_sessions_on_one_redis(
    aiohttp_server: Any, tmp_path: Path, redis_prefix: str
) -> None:
    where = tmp_path / "data"
    store = f'path: {where}, backend: redis, url: "{REDIS_URL}", prefix: "{redis_prefix}"'
    path = await write_config(aiohttp_server, tmp_path, store)
    async with proxies(path, 2) as (one, two):
        for n in range(4):  # the session's turns alternate between the replicas
            await converse((one, two)[n % 2].url, ALICE, "shared", 1, start=n)
        await converse(two.url, BOB, "shared", 1)
        seen = [await listed(p.url, ALICE, turns=4) for p in (one, two)]
        bobs = [await listed(p.url, BOB, turns=1) for p in (one, two)]
    assert figures(seen[0][0]) == figures(seen[1][0])
    assert [(r["session"], r["calls"]) for r in seen[0]] == [("shared", 4)]
    assert [(r["session"], r["calls"]) for r in bobs[0]] == [("shared", 1)]
    assert bobs[0][0]["id"] == bobs[1][0]["id"] != seen[0][0]["id"]


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
async def test_the_list_and_replay_count_a_recorded_session_alike(
    trace: Path,
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A shipped trace (chat, Anthropic, Responses) driven through a recording proxy: the
    list's context tokens, received and sent upstream, are replay's totals for it."""
    turns = read_trace(trace)
    upstream = TraceUpstream(turns)
    server: TestServer = await aiohttp_server(upstream.app())
    document = built_in(turns, str(server.make_url("")).rstrip("/"), str(tmp_path / "state"))
    document["policies"][0]["record"] = {"enabled": True}
    path = tmp_path / "live.yaml"
    path.write_text(yaml.safe_dump(document))
    proxy = await start_proxy(path)
    url = str(proxy.make_url("")).rstrip("/")
    for turn in turns:
        status, _ = await _send(url, turn)  # as session "replay", in the client's own SDK
        assert status == 200
    await proxy.app[RECORDINGS].flush()
    async with aiohttp.ClientSession() as http, http.get(url + "/admin/sessions") as response:
        (row,) = (await response.json())["data"]

    args = ["replay", "--session", row["session"], "--config", str(path), "--json"]
    assert await asyncio.to_thread(cli.main, args) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert row["calls"] == totals["calls"] == len(turns)
    assert row["turns"] == totals["turns"]
    assert row["tokens_sent"] < row["tokens_received"]
    assert (row["tokens_received"], row["tokens_sent"]) == (
        totals["tokens_received"],
        totals["tokens_sent"],
    )


TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}}]  # fmt: skip


def _answer(n: int, message: dict[str, Any]) -> dict[str, Any]:
    stop = "tool_calls" if message.get("tool_calls") else "stop"
    return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": stop}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}  # fmt: skip


def tool_rounds() -> list[dict[str, Any]]:
    """Two prompts, each answered after a tool round: four calls, two client turns."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    calls = []
    for n, (prompt, path) in enumerate((("What is in a.txt?", "a.txt"), ("And b?", "b.txt"))):
        history.append({"role": "user", "content": prompt})
        reads = {"name": "read_file", "arguments": json.dumps({"path": path})}
        call = {"id": f"call_{n}", "type": "function", "function": reads}
        asks = {"role": "assistant", "content": None, "tool_calls": [call]}
        calls.append({"wire": "chat", "request": {"model": "m", "messages": list(history),
                      "tools": TOOLS}, "answer": _answer(2 * n, asks)})  # fmt: skip
        history += [asks, {"role": "tool", "tool_call_id": f"call_{n}", "content": f"{path}!"}]
        says = {"role": "assistant", "content": f"{path} says hello."}
        calls.append({"wire": "chat", "request": {"model": "m", "messages": list(history),
                      "tools": TOOLS}, "answer": _answer(2 * n + 1, says)})  # fmt: skip
        history.append(says)
    return calls


async def test_the_list_and_replay_count_client_turns_alike(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A session of two prompts, each answered after a tool round (four calls), recorded:
    the list says 2 turns in 4 calls, and so does replay, of the recorded session (its
    calls' own `turn`) and of the same calls as a trace file without them (worked out)."""
    calls = tool_rounds()
    trace = tmp_path / "rounds.jsonl"
    trace.write_text("".join(json.dumps(call) + "\n" for call in calls))
    server: TestServer = await aiohttp_server(TraceUpstream(calls).app())
    document = built_in(calls, str(server.make_url("")).rstrip("/"), str(tmp_path / "state"))
    document["policies"][0]["record"] = {"enabled": True}
    path = tmp_path / "live.yaml"
    path.write_text(yaml.safe_dump(document))
    proxy = await start_proxy(path)
    url = str(proxy.make_url("")).rstrip("/")
    for call in calls:
        assert (await _send(url, call))[0] == 200
    await proxy.app[RECORDINGS].flush()
    async with aiohttp.ClientSession() as http, http.get(url + "/admin/sessions") as response:
        (row,) = (await response.json())["data"]
    assert (row["turns"], row["calls"]) == (2, 4)

    for source in (["--session", row["session"]], [str(trace)]):
        assert await asyncio.to_thread(cli.main, ["replay", *source, "--config", str(path),
                                                  "--json"]) == 0  # fmt: skip
        out = json.loads(capsys.readouterr().out)
        assert (out["totals"]["turns"], out["totals"]["calls"]) == (row["turns"], row["calls"])
        assert [(r["call"], r["turn"]) for r in out["calls"]] == [(1, 1), (2, 1), (3, 2), (4, 2)]
    text = await asyncio.to_thread(cli.main, ["replay", str(trace), "--config", str(path)])
    assert text == 0 and "2 turns, 4 calls: tokens received" in capsys.readouterr().out


async def test_a_turn_measures_its_new_messages_only(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The writer keeps each part's count: over a 20-turn session whose history grows two
    messages a turn, it measures about the new ones (received and sent), not the history
    again every turn (840 entries)."""
    from proxy.sim import measure

    measured: list[Any] = []
    entry_tokens = measure.entry_tokens

    def counting(wire: str, entry: Any) -> int:
        measured.append(entry)
        return entry_tokens(wire, entry)

    monkeypatch.setattr(measure, "entry_tokens", counting)
    path = await write_config(aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    proxy = await start_proxy(path)
    url = str(proxy.make_url("")).rstrip("/")
    turns = 20
    for n in range(turns):
        await converse(url, ALICE, "long", 1, start=n)
        await proxy.app[RECORDINGS].flush()  # each turn measured by the session's memo
    (row,) = await listed(url, ALICE, turns=turns)
    assert row["calls"] == turns and row["tokens_sent"] < row["tokens_received"]
    assert len(measured) <= 5 * turns, len(measured)
