"""Tenants are walls: a second key that sends the same session id (or names the first key's
session as its parent) changes nothing the first key's session sees, is charged or can read.

Each test plays the attack over real sockets: key B (bob) interferes with key A's (alice's)
session, then A's next request must behave exactly as if B had never existed.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Fault, Simulator
from proxy.state import TURN_MEMORY
from tests.conftest import ProxyFactory, base_url, sim_config

ALICE, BOB, CAROL = "sk-alice-0001", "sk-bob-0002", "sk-carol-0003"
KEYS = f"""
keys:
  api_keys:
    - {{name: alice, key: {ALICE}, team: red}}
    - {{name: bob, key: {BOB}, team: blue}}
    - {{name: carol, key: {CAROL}, team: red}}
"""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


async def start(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    policies: str = "",
    *,
    keys: str = KEYS,
    window: int = 8192,
    store: str = "",
) -> TestServer:
    path = tmp_path / "tenants.yaml"
    store = store or f"store: {{path: {tmp_path / 'state'}}}"
    extra = f"{store}\n{textwrap.dedent(keys)}\n"
    extra += textwrap.dedent(policies)
    url = str(upstream.make_url("")).rstrip("/")
    path.write_text(sim_config(url, extra, window=window))
    return await start_proxy(path)


def client(proxy: TestServer, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(proxy), api_key=key, max_retries=0)


def session(name: str, parent: str | None = None) -> dict[str, str]:
    headers = {"x-agentproxy-session": name}
    if parent:
        headers["x-agentproxy-parent-session"] = parent
    return headers


async def ask(
    proxy: TestServer, key: str, headers: dict[str, str], text: str = "hi", **body: Any
) -> Any:
    return await client(proxy, key).chat.completions.with_raw_response.create(
        model="sim", messages=[{"role": "user", "content": text}], extra_headers=headers, **body
    )


# --- budgets ---------------------------------------------------------------------------------

BUDGET = """
policies:
  - name: metered
    budgets:
      - {name: per-session, limits: {calls: 3}}
"""


async def test_another_key_with_the_same_session_id_cannot_drain_its_budget(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, BUDGET)
    await ask(proxy, ALICE, session("s1"))
    for _ in range(3):
        await ask(proxy, BOB, session("s1"))
    # Bob's own s1 is spent, and his refusal names only his own spend.
    with pytest.raises(openai.RateLimitError) as refused:
        await ask(proxy, BOB, session("s1"))
    body = refused.value.body
    assert isinstance(body, dict) and body["budget"]["spent"] == 3
    assert body["budget"]["scope_id"] == "s1" and "alice" not in str(body)
    # Alice's s1 has one call spent: two more go through.
    for _ in range(2):
        raw = await ask(proxy, ALICE, session("s1"))
        assert raw.http_response.status_code == 200
        assert raw.headers["x-agentproxy-session"] == "s1"  # the name she gave, unchanged


async def test_a_parent_session_of_another_key_is_not_charged(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, BUDGET)
    await ask(proxy, ALICE, session("lead"))
    for i in range(3):  # bob's subagents name alice's session as their parent
        await ask(proxy, BOB, session(f"bob-sub-{i}", parent="lead"))
    for _ in range(2):
        raw = await ask(proxy, ALICE, session("lead"))
        assert raw.http_response.status_code == 200


# --- loop ladder ----------------------------------------------------------------------------

ARGUMENTS = '{"path": "missing.txt"}'


def stubborn_model(body: dict[str, Any]) -> dict[str, Any]:
    turn = len(body["messages"])
    function = {"name": "read_file", "arguments": ARGUMENTS}
    call = {"id": f"call_{turn}", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def looping_history(turns: int, who: str) -> list[dict[str, Any]]:
    """`turns` identical read_file calls: the same loop (hash) whoever sends it."""
    history: list[dict[str, Any]] = [{"role": "user", "content": f"{who}'s task"}]
    for i in range(turns):
        function = {"name": "read_file", "arguments": ARGUMENTS}
        call = {"id": f"{who}{i}", "type": "function", "function": function}
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": f"{who}{i}", "content": "ENOENT"})
    return history


async def test_another_key_cannot_push_a_session_up_the_loop_ladder(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    upstream = await aiohttp_server(Simulator(responder=stubborn_model).app())
    proxy = await start(start_proxy, tmp_path, upstream)

    async def loop(key: str, turns: int) -> str:
        try:
            raw = await client(proxy, key).chat.completions.with_raw_response.create(
                model="sim",
                messages=looping_history(turns, "alice" if key == ALICE else "bob"),  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
                extra_headers=session("s1"),
            )
        except openai.APIStatusError as refused:
            return str(refused.body)
        return raw.headers.get("x-agentproxy-applied", "")

    assert "loops.warn" in await loop(ALICE, 3)  # alice's first detection
    for turns in range(4, 8):  # bob's same loop in "s1", up to the top of his ladder
        await loop(BOB, turns)
    assert "loops.block" in await loop(BOB, 8) or "loop" in await loop(BOB, 8)
    assert "loops.no_tools" in await loop(ALICE, 4)  # her second step: the next rung only


# --- session circuit ------------------------------------------------------------------------

CIRCUIT = """
policies:
  - name: guarded
    retry: {attempts: 1}
    circuit: {session_failures: 2}
"""


async def test_another_keys_failures_do_not_open_a_sessions_circuit(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    sim = Simulator()
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), CIRCUIT)
    await ask(proxy, ALICE, session("s1"), "same")
    sim.inject(Fault(status=400, times=2))  # deterministic rejections of bob's requests
    for _ in range(2):
        with pytest.raises(openai.BadRequestError):
            await ask(proxy, BOB, session("s1"), "same")
    with pytest.raises(openai.RateLimitError):  # bob's own session: refused before the model
        await ask(proxy, BOB, session("s1"), "same")
    raw = await ask(proxy, ALICE, session("s1"), "same")
    assert raw.http_response.status_code == 200


# --- learned windows ------------------------------------------------------------------------


def long_history(opening: str, steps: int = 12, chars: int = 200) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "user", "content": opening}]
    for i in range(steps):
        function = {"name": "read_file", "arguments": f'{{"path": "m{i}.py"}}'}
        call = {"id": f"c{i}", "type": "function", "function": function}
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": f"c{i}", "content": "x = 1\n" * chars})
    return history


def compacted(raw: Any) -> bool:
    return "compaction" in raw.headers.get("x-agentproxy-applied", "")


async def test_an_output_reservation_overflow_does_not_shrink_the_sessions_window(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    """Bob (and alice herself) ask for 8,191 answer tokens with a tiny prompt: the provider
    overflows, but the prompt was not the cause, so no small window is learned from it."""
    sim = Simulator(context_window=8192)
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), window=100_000)
    history = long_history("Port the parser.", steps=6)  # ~2k tokens: fits an 8k window
    for key in (BOB, ALICE):
        with pytest.raises(openai.BadRequestError) as overflowed:  # passed on as it came
            await ask(proxy, key, session("s1"), "tiny", max_tokens=8191)
        assert "maximum context length" in str(overflowed.value.body)
    raw = await client(proxy, ALICE).chat.completions.with_raw_response.create(
        model="sim",
        messages=history,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        extra_headers=session("s1"),
    )
    assert raw.http_response.status_code == 200
    assert not compacted(raw)
    assert sim.requests[-1].body["messages"] == history


async def test_another_keys_overflow_teaches_nothing_to_a_session(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    sim = Simulator(context_window=3000)
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), window=100_000)
    raw = await client(proxy, BOB).chat.completions.with_raw_response.create(
        model="sim",
        messages=long_history("bob's big task", steps=12),  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        extra_headers=session("s1"),
    )
    assert "overflow_compacted" in raw.headers["x-agentproxy-applied"]  # bob's s1 learned
    small = long_history("alice's task", steps=2, chars=50)  # ~200 tokens: fits anywhere
    raw = await client(proxy, ALICE).chat.completions.with_raw_response.create(
        model="sim",
        messages=small,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        extra_headers=session("s1"),
    )
    assert not compacted(raw)
    assert sim.requests[-1].body["messages"] == small


# --- references and the archive -------------------------------------------------------------

OFFLOAD = """
policies:
  - name: tight
    offload: {min_tokens: 500}
"""
PAYLOAD = "\n".join(f"line {i}: alice's secret report, row {i}" for i in range(600))


def with_result(content: str) -> list[dict[str, Any]]:
    function = {"name": "read_file", "arguments": '{"path": "report.txt"}'}
    return [
        {"role": "user", "content": "read the report"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": function}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": content},
    ]


async def offloaded_ref(proxy: TestServer, sim: Simulator, key: str, name: str) -> str:
    await client(proxy, key).chat.completions.create(
        model="sim",
        messages=with_result(PAYLOAD),  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        extra_headers=session(name),
    )
    pointer = sim.requests[-1].body["messages"][2]["content"]
    found = re.search(r"reference: (ap_\w+)", pointer)
    assert found, pointer
    return found.group(1)


async def fetch(proxy: TestServer, path: str, key: str) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(str(proxy.make_url(path)), headers=headers) as r:
            return r.status, await r.json()


async def test_the_same_content_from_two_keys_gets_two_references_each_its_own(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    """Bob stores the bytes first; alice's pointer must still name a ref she can read."""
    sim = Simulator()
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), OFFLOAD)
    bobs = await offloaded_ref(proxy, sim, BOB, "sr")
    alices = await offloaded_ref(proxy, sim, ALICE, "sr")
    assert alices != bobs
    status, body = await fetch(proxy, f"/v1/agentproxy/archive/{alices}", ALICE)
    assert status == 200 and body["content"] == PAYLOAD and body["session"] == "sr"
    status, _ = await fetch(proxy, f"/v1/agentproxy/archive/{alices}", BOB)
    assert status == 404  # and bob's guess at alice's ref answers like an unknown one
    status, listing = await fetch(proxy, "/v1/agentproxy/sessions/sr/archive", BOB)
    assert status == 200 and [b["ref"] for b in listing["data"]] == [bobs]


async def test_a_guessed_content_reveals_nothing_about_another_keys_session(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    """The content oracle: bob sends a candidate in alice's session id and fetches his own
    new ref; the answer is the same whether or not alice holds that content."""
    sim = Simulator()
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), OFFLOAD)
    await offloaded_ref(proxy, sim, ALICE, "sr")
    guess = await offloaded_ref(proxy, sim, BOB, "sr")  # the right guess
    status, body = await fetch(proxy, f"/v1/agentproxy/archive/{guess}", BOB)
    assert status == 200 and body["content"] == PAYLOAD  # his own copy, nothing more
    listing = (await fetch(proxy, "/v1/agentproxy/sessions/sr/archive", BOB))[1]
    assert len(listing["data"]) == 1


RECALL_NEEDLE = "row 300"


def recalling_model(body: dict[str, Any]) -> dict[str, Any]:
    """Recalls by search once, then answers with what the search returned."""
    last = body["messages"][-1]
    if last.get("role") == "tool" and str(last.get("tool_call_id", "")).startswith("recall"):
        return {"role": "assistant", "content": f"FOUND: {last['content'][:200]}"}
    arguments = f'{{"query": "{RECALL_NEEDLE}"}}'
    function = {"name": "agentproxy_recall", "arguments": arguments}
    call = {"id": "recall_1", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


async def test_recall_searches_only_the_callers_own_session(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    sim = Simulator()
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), OFFLOAD)
    await offloaded_ref(proxy, sim, ALICE, "sr")
    sim.responder = recalling_model
    answer = await client(proxy, BOB).chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "what is in row 300?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        extra_headers=session("sr"),
    )
    assert "alice's secret" not in (answer.choices[0].message.content or "")
    assert "no archived content" in (answer.choices[0].message.content or "")


# --- team sharing ---------------------------------------------------------------------------


async def test_keys_of_one_team_share_sessions_when_the_config_says_so(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    sim = Simulator()
    shared = KEYS + "  session_scope: team\n"
    policies = """
    policies:
      - name: shared
        offload: {min_tokens: 500}
        budgets: [{name: per-session, limits: {calls: 3}}]
    """
    proxy = await start(
        start_proxy, tmp_path, await aiohttp_server(sim.app()), policies, keys=shared
    )
    ref = await offloaded_ref(proxy, sim, ALICE, "sr")
    status, _ = await fetch(proxy, f"/v1/agentproxy/archive/{ref}", CAROL)  # same team: red
    assert status == 200
    status, _ = await fetch(proxy, f"/v1/agentproxy/archive/{ref}", BOB)  # team blue
    assert status == 404
    await ask(proxy, CAROL, session("sr"))
    await ask(proxy, CAROL, session("sr"))  # alice 1 + carol 2: the team's "sr" is spent
    with pytest.raises(openai.RateLimitError):
        await ask(proxy, ALICE, session("sr"))
    raw = await ask(proxy, BOB, session("sr"))  # another team: its own "sr"
    assert raw.http_response.status_code == 200


# --- the same walls with the Redis backend ----------------------------------------------------


async def test_redis_backend_keeps_tenants_apart(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, redis_prefix: str
) -> None:
    from tests.conftest import REDIS_URL

    sim = Simulator()
    policies = """
    policies:
      - name: shared
        offload: {min_tokens: 500}
        budgets: [{name: per-session, limits: {calls: 2}}]
    """
    store = f"store: {{backend: redis, url: {REDIS_URL}, prefix: '{redis_prefix}'}}"
    upstream = await aiohttp_server(sim.app())
    proxy = await start(start_proxy, tmp_path, upstream, policies, store=store)
    alices = await offloaded_ref(proxy, sim, ALICE, "sr")
    bobs = await offloaded_ref(proxy, sim, BOB, "sr")
    assert alices != bobs
    await ask(proxy, BOB, session("sr"))
    with pytest.raises(openai.RateLimitError):  # bob's two calls spent his own "sr"
        await ask(proxy, BOB, session("sr"))
    assert (await fetch(proxy, f"/v1/agentproxy/archive/{alices}", BOB))[0] == 404
    status, body = await fetch(proxy, f"/v1/agentproxy/archive/{alices}", ALICE)
    assert status == 200 and body["content"] == PAYLOAD
    raw = await ask(proxy, ALICE, session("sr"))  # alice's "sr" still has a call left
    assert raw.http_response.status_code == 200


# --- the same walls on every wire -------------------------------------------------------------


async def test_claude_code_and_codex_session_ids_are_walled_per_key_too(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    """The session ids agents send themselves (Claude Code's header on /v1/messages, Codex's
    on /v1/responses) name a session of the caller's own, like x-agentproxy-session."""
    proxy = await start(start_proxy, tmp_path, sim_server, BUDGET)

    async def post(path: str, key: str, headers: dict[str, str], body: dict[str, Any]) -> int:
        async with aiohttp.ClientSession() as http:
            url = str(proxy.make_url(path))
            async with http.post(url, json=body, headers={"x-api-key": key, **headers}) as r:
                return r.status

    messages = {"model": "sim", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
    responses = {"model": "sim", "input": "hi"}
    for path, header, body in (
        ("/v1/messages", "x-claude-code-session-id", messages),
        ("/v1/responses", "session-id", responses),
    ):
        assert await post(path, ALICE, {header: f"{path}-s"}, body) == 200
        statuses = [await post(path, BOB, {header: f"{path}-s"}, body) for _ in range(4)]
        assert statuses == [200, 200, 200, 429]  # bob spent his own session's three calls
        assert await post(path, ALICE, {header: f"{path}-s"}, body) == 200  # alice: 2 of 3


def _history(wire: str, text: str, turns: int) -> tuple[str, dict[str, Any]]:
    """A request of `turns` past turns and a new one, in `wire`: its path and body."""
    said = [(f"{text} {n}", f"ok {n}") for n in range(turns)]
    if wire == "responses":
        items = [
            {"type": "message", "role": role, "content": content}
            for pair in said
            for role, content in zip(("user", "assistant"), pair, strict=True)
        ]
        items.append({"type": "message", "role": "user", "content": f"{text} last"})
        return "/v1/responses", {"model": "sim", "input": items}
    if wire == "anthropic":
        messages = [
            {"role": role, "content": content}
            for pair in said
            for role, content in zip(("user", "assistant"), pair, strict=True)
        ]
        messages.append({"role": "user", "content": f"{text} last"})
        return "/v1/messages", {"model": "sim", "max_tokens": 64, "messages": messages}
    contents = [
        {"role": role, "parts": [{"text": content}]}
        for pair in said
        for role, content in zip(("user", "model"), pair, strict=True)
    ]
    contents.append({"role": "user", "parts": [{"text": f"{text} last"}]})
    return "/v1beta/models/sim:generateContent", {"contents": contents}


@pytest.mark.parametrize("wire", ["responses", "anthropic", "gemini"])
async def test_memory_across_turns_stays_with_its_key(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, sim: Simulator, wire: str
) -> None:
    """Each route keeps the session's memory of its last turn to build the next turn's view
    from what is new, under the owner's key: bob's turns under alice's session id, the very
    history she sent included, neither recall nor replace hers, and each key's next turn goes
    upstream as that key sent it."""
    proxy = await start(start_proxy, tmp_path, sim_server)
    memory = proxy.app[TURN_MEMORY]

    async def post(key: str, text: str, turns: int) -> dict[str, Any]:
        path, body = _history(wire, text, turns)
        async with aiohttp.ClientSession() as http:
            headers = {"authorization": f"Bearer {key}", "session-id": "shared"}
            async with http.post(proxy.make_url(path), json=body, headers=headers) as r:
                assert r.status == 200, await r.text()
        return sim.requests[-1].body

    def kept(owner: str) -> object:
        entry = memory.cache.get(f"{owner}/shared")
        assert entry is not None, owner
        return entry[1]

    await post(ALICE, "alice", 2)
    alices = kept("key:alice")
    await post(BOB, "alice", 2)  # the very same history, under the same session id
    assert kept("key:alice") is alices and kept("key:bob") is not alices
    assert memory.recall("key:bob", "shared", type(alices)) is kept("key:bob")
    assert memory.recall("key:carol", "shared", type(alices)) is None  # carol sent nothing
    await post(BOB, "bob", 2)
    assert {k.partition("/")[0] for k in memory.cache} == {"key:alice", "key:bob"}
    sent = orjson.dumps(await post(ALICE, "alice", 3)).decode()  # lent alice's own last turn
    assert all(f"alice {n}" in sent for n in range(3)) and "alice last" in sent
    assert "bob" not in sent
    sent = orjson.dumps(await post(BOB, "bob", 3)).decode()
    assert "alice" not in sent and "bob 2" in sent
