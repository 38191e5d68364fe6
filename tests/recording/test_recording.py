"""Recorded sessions over real sockets: each turn read back in the trace shape of all three wire
formats (JSON and streams), redaction before anything reaches the store (the raw SQLite file
and Redis values scanned), the per-session bound, content addressing over 100 turns, and
tenants: a second key sending the same session id sees neither the recording nor the session.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.recording.sessions import recorded_turns
from proxy.sessions.identity import scoped
from proxy.sim.simulator import Simulator
from proxy.state import METRICS, RECORDINGS, STORE
from proxy.store.base import RECORDING_KINDS, StoreError
from tests.conftest import REDIS_URL, ProxyFactory, base_url

ALICE, BOB = "sk-alice-key-0001", "sk-bob-key-00002"
UPSTREAM_KEY = "sk-sim-upstream-secret"
SECRET = "SECRET-TOKEN-8472913"


def config(url: str, store: str, record: str = "{enabled: true}") -> str:
    return textwrap.dedent(
        f"""\
        store: {{{store}}}
        keys:
          api_keys:
            - {{name: alice, key: {ALICE}}}
            - {{name: bob, key: {BOB}}}
        model_list:
          - model_name: sim
            litellm_params: {{model: openai/sim, api_base: {url}/v1, api_key: {UPSTREAM_KEY}}}
          - model_name: claude
            litellm_params:
              {{model: anthropic/claude-sim, api_base: {url}, api_key: {UPSTREAM_KEY}}}
        policies:
          - name: recorded
            record: {record}
          - name: unrecorded
            record: {{enabled: false}}
        """
    )


@pytest.fixture(params=["local", "redis"])
def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    where = f"path: {tmp_path / 'data'}"
    if request.param == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        return f'{where}, backend: redis, url: "{REDIS_URL}", prefix: "{prefix}"'
    return where


async def start(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, store: str, **kw: str
) -> TestServer:
    sim = Simulator(context_window=200_000)
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), store, **kw))
    return await start_proxy(path)


async def turns_of(
    proxy: TestServer, owner: str, name: str, count: int = 1
) -> list[dict[str, Any]]:
    """The session's recorded turns, once `count` are (a stream's turn is queued when its
    handler ends, which may be just after the client read the stream's end)."""
    for _ in range(200):
        await proxy.app[RECORDINGS].flush()
        turns = await recorded_turns(proxy.app[STORE], scoped(owner, name))
        if len(turns) >= count:
            return turns
        await asyncio.sleep(0.01)
    return turns


def chat(proxy: TestServer, key: str = ALICE) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(proxy), api_key=key, max_retries=0)


def session(name: str) -> dict[str, str]:
    return {"x-agentproxy-session": name}


async def test_chat_turns_read_back_as_trace_lines_json_and_stream(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, store_config: str
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path, store_config)
    history = [{"role": "user", "content": "say hello"}]
    reply = await chat(proxy).chat.completions.create(
        model="sim", messages=history, extra_headers=session("s1")
    )
    text = reply.choices[0].message.content
    history += [{"role": "assistant", "content": text}, {"role": "user", "content": "again"}]
    stream = await chat(proxy).chat.completions.create(
        model="sim", messages=history, stream=True, extra_headers=session("s1"),
        stream_options={"include_usage": True},
    )  # fmt: skip
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    first, second = await turns_of(proxy, "key:alice", "s1", 2)
    assert first["wire"] == "chat" and first["route"] == "/v1/chat/completions"
    assert first["request"] == {"model": "sim", "messages": history[:1]}
    assert first["status"] == 200 and first["answer"]["object"] == "chat.completion"
    assert first["answer"]["choices"][0]["message"]["content"] == text
    assert first["sent"]["messages"] == history[:1]
    assert first["usage"]["prompt_tokens"] > 0 and first["model"] == "sim"
    assert isinstance(first["events"], list) and first["at"] > 0
    assert second["request"]["messages"] == history and second["request"]["stream"] is True
    # The stream, assembled into the answer a non-streamed request would have had.
    assert second["answer"]["object"] == "chat.completion"
    assert second["answer"]["choices"][0]["message"]["content"] == streamed
    assert second["answer"]["choices"][0]["finish_reason"] == "stop"
    assert second["usage"]["completion_tokens"] > 0


async def test_anthropic_turns_read_back_json_and_stream(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    sdk = anthropic.AsyncAnthropic(base_url=str(proxy.make_url("")), api_key=ALICE, max_retries=0)
    ask = [{"role": "user", "content": "say hello"}]
    reply = await sdk.messages.create(
        model="claude", max_tokens=200, messages=ask, system="be brief",
        extra_headers=session("a1"),
    )  # fmt: skip
    async with sdk.messages.stream(
        model="claude", max_tokens=200, messages=ask, extra_headers=session("a1")
    ) as stream:
        final = await stream.get_final_message()

    first, second = await turns_of(proxy, "key:alice", "a1", 2)
    assert first["wire"] == "anthropic" and first["route"] == "/v1/messages"
    assert first["request"]["system"] == "be brief" and first["request"]["messages"] == ask
    assert first["answer"]["type"] == "message"
    assert first["answer"]["content"] == reply.model_dump(exclude_none=True)["content"]
    assert second["answer"]["type"] == "message" and second["answer"]["content"]
    assert second["answer"]["content"][0]["text"] == final.content[0].text  # type: ignore[union-attr]
    assert second["answer"]["stop_reason"] == final.stop_reason
    assert second["status"] == 200 and "sent" in second


async def test_a_turn_keeps_the_clients_protocol_headers_never_its_key(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    """What the request means depends on them (a beta allows `role: "system"` in messages):
    replay sends them again. The key and the other headers are not kept."""
    proxy = await start(start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    beta = "mid-conversation-tool-changes-2026-07-01"
    sdk = anthropic.AsyncAnthropic(base_url=str(proxy.make_url("")), api_key=ALICE, max_retries=0)
    await sdk.messages.create(
        model="claude", max_tokens=200, extra_headers=session("h1") | {"anthropic-beta": beta},
        messages=[{"role": "user", "content": "hi"},
                  {"role": "system", "content": "the tools changed"},
                  {"role": "user", "content": "again"}],
    )  # fmt: skip
    [turn] = await turns_of(proxy, "key:alice", "h1")
    assert set(turn["headers"]) == {"anthropic-version", "anthropic-beta"}  # as the SDK sent
    assert turn["headers"]["anthropic-beta"] == beta
    await chat(proxy).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "hi"}], extra_headers=session("h2")
    )
    [turn] = await turns_of(proxy, "key:alice", "h2")
    assert "headers" not in turn  # a wire that passes none on keeps none
    assert ALICE.encode() not in _stored_bytes(proxy, tmp_path, None)


async def test_responses_turns_read_back_json_and_stream(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    sdk = chat(proxy)
    items = [{"role": "user", "content": "say hello"}]
    reply = await sdk.responses.create(model="sim", input=items, extra_headers=session("r1"))
    stream = await sdk.responses.create(
        model="sim", input=items, stream=True, extra_headers=session("r1")
    )
    done = [event async for event in stream if event.type == "response.completed"]

    first, second = await turns_of(proxy, "key:alice", "r1", 2)
    assert first["wire"] == "responses" and first["route"] == "/v1/responses"
    assert first["request"]["input"] == items
    assert first["answer"]["object"] == "response" and first["answer"]["id"] == reply.id
    assert second["answer"]["id"] == done[0].response.id
    assert second["answer"]["status"] == "completed" and second["answer"]["output"]


def _stored_bytes(proxy: TestServer, tmp_path: Path, prefix: str | None) -> bytes:
    """Everything the store holds, raw: the SQLite files, or every value under the prefix."""
    if prefix is None:
        return b"".join(p.read_bytes() for p in (tmp_path / "data").glob("store.sqlite3*"))
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    out = []
    for key in client.scan_iter(match=prefix + "*"):
        kind = client.type(key)
        if kind == b"hash":
            out += [k + v for k, v in client.hgetall(key).items()]
        elif kind == b"list":
            out += client.lrange(key, 0, -1)
        elif kind == b"string":
            out.append(client.get(key) or b"")
        elif kind == b"zset":
            out += client.zrange(key, 0, -1)
    client.close()
    return b"\n".join(out)


async def test_secrets_never_reach_the_store(
    start_proxy: ProxyFactory,
    aiohttp_server: Any,
    tmp_path: Path,
    store_config: str,
    request: pytest.FixtureRequest,
) -> None:
    record = "{enabled: true, redact: ['SECRET-TOKEN-[0-9]+']}"
    proxy = await start(start_proxy, aiohttp_server, tmp_path, store_config, record=record)
    call = {"id": "call_1", "type": "function",
            "function": {"name": "read_env", "arguments": "{}"}}  # fmt: skip
    history = [
        {"role": "user", "content": f"my key is {ALICE}, the upstream's {UPSTREAM_KEY}"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": f"API_TOKEN={SECRET}\nok"},
    ]
    await chat(proxy).chat.completions.create(
        model="sim", messages=history, extra_headers=session("leaky")
    )
    [turn] = await turns_of(proxy, "key:alice", "leaky")
    assert turn["request"]["messages"][2]["content"] == "API_TOKEN=[redacted]\nok"
    assert "[redacted]" in turn["request"]["messages"][0]["content"]
    await proxy.app[STORE].close()  # everything on disk, for the scan
    prefix = request.getfixturevalue("redis_prefix") if "redis" in store_config else None
    raw = _stored_bytes(proxy, tmp_path, prefix)
    assert b"[redacted]" in raw  # the scan does read the recording
    for secret in (SECRET, ALICE, UPSTREAM_KEY):
        assert secret.encode() not in raw, secret


async def test_a_session_past_its_bound_stops_recording(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    record = "{enabled: true, max_mb_per_session: 0.02}"  # 20 KB
    proxy = await start(
        start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}", record=record
    )
    history: list[dict[str, Any]] = []
    for turn in range(12):
        history.append({"role": "user", "content": f"turn {turn} " + "x" * 3000})
        await chat(proxy).chat.completions.create(
            model="sim", messages=history, extra_headers=session("big")
        )
        history.append({"role": "assistant", "content": "ok"})
    turns = await turns_of(proxy, "key:alice", "big")
    assert 3 <= len(turns) < 12
    blobs = await proxy.app[STORE].blobs(scoped("key:alice", "big"))
    assert sum(b.size for b in blobs if b.kind in RECORDING_KINDS) <= 20 * 1024 * 1024 // 1000
    outcomes = _outcomes(proxy)
    assert outcomes["stopped"] == 1 and outcomes["skipped"] == 12 - len(turns) - 1
    assert outcomes["recorded"] == len(turns)
    stopped = proxy.app[METRICS].rewrites.labels("record", "stopped")._value.get()
    assert stopped == 1  # and said in the event log, as every event


async def test_a_store_that_fails_fails_no_request(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, store_config: str
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path, store_config)
    store = proxy.app[STORE]

    async def refuse(items: Any) -> None:
        raise StoreError("the disk is full")

    store.inner.put_many = refuse  # type: ignore[attr-defined]
    for text in ("one", "two"):
        reply = await chat(proxy).chat.completions.create(
            model="sim", messages=[{"role": "user", "content": text}],
            extra_headers=session("unlucky"),
        )  # fmt: skip
        assert reply.choices[0].message.content
    await proxy.app[RECORDINGS].flush()
    assert _outcomes(proxy)["failed"] == 2
    assert await recorded_turns(store, scoped("key:alice", "unlucky")) == []


def _outcomes(proxy: TestServer) -> dict[str, float]:
    metrics = proxy.app[METRICS]
    return {
        sample.labels["outcome"]: sample.value
        for family in metrics.recorded_turns.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    }


async def test_a_hundred_turns_grow_with_their_new_messages_only(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    store = proxy.app[STORE]
    name = scoped("key:alice", "long")
    history: list[dict[str, Any]] = [{"role": "system", "content": "s" * 2000}]
    sizes: list[int] = []
    async with aiohttp.ClientSession() as http:
        for turn in range(100):
            history.append({"role": "user", "content": f"step {turn}: " + "y" * 500})
            async with http.post(
                str(proxy.make_url("/v1/chat/completions")),
                json={"model": "sim", "messages": history},
                headers={"authorization": f"Bearer {ALICE}", **session("long")},
            ) as response:
                answer = await response.json()
            history.append(answer["choices"][0]["message"])
            await proxy.app[RECORDINGS].flush()
            blobs = await store.blobs(name)
            sizes.append(sum(b.size for b in blobs if b.kind in RECORDING_KINDS))
    per_turn = [after - before for before, after in itertools.pairwise(sizes)]
    early, late = sum(per_turn[5:15]) / 10, sum(per_turn[-10:]) / 10
    print(f"recording bytes per turn: turns 6-15 {early:.0f}, turns 90-99 {late:.0f}, "
          f"100 turns {sizes[-1]} for {len(orjson_bytes(history))} bytes of history")  # fmt: skip
    assert late <= early * 1.1  # the hundredth turn costs what the tenth did
    # and as much work: only the new messages are serialized and hashed (law 7), the rest is
    # the earlier turn's as far as the chain found the history unchanged
    assert proxy.app[RECORDINGS].hashed <= 2 * 100 + 1
    assert sizes[-1] < 3 * len(orjson_bytes(history))
    turns = await recorded_turns(store, name)
    assert len(turns) == 100 and turns[-1]["request"]["messages"] == history[:-1]
    assert list(turns[0]["request"]) == ["model", "messages"]  # the client's key order


def orjson_bytes(value: Any) -> bytes:
    import orjson

    return orjson.dumps(value)


async def test_another_key_with_the_same_session_id_sees_neither_recording_nor_session(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, store_config: str
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path, store_config)
    await chat(proxy, ALICE).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "alice's plan"}],
        extra_headers=session("shared"),
    )  # fmt: skip
    await chat(proxy, BOB).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "bob's plan"}],
        extra_headers=session("shared"),
    )  # fmt: skip
    [alices] = await turns_of(proxy, "key:alice", "shared")
    [bobs] = await turns_of(proxy, "key:bob", "shared")
    assert "alice" in alices["request"]["messages"][0]["content"]
    assert "bob" in bobs["request"]["messages"][0]["content"]
    async with aiohttp.ClientSession() as http:
        url = str(proxy.make_url("/admin/sessions"))
        async with http.get(url, headers={"authorization": f"Bearer {BOB}"}) as listed:
            assert listed.status == 200
            rows = (await listed.json())["data"]
        assert [(r["session"], r["key"]) for r in rows] == [("shared", "bob")]
        async with http.get(url) as everyone:  # keys, no admin key: nobody sees every tenant's
            assert everyone.status == 401
        async with http.get(url, headers={"authorization": f"Bearer {ALICE}"}) as hers:
            [row] = (await hers.json())["data"]
        assert row["key"] == "alice"
        alice_url = f"{url}/{row['id']}"
        async with http.get(alice_url, headers={"authorization": f"Bearer {BOB}"}) as theirs:
            assert theirs.status == 404
        async with http.get(alice_url, headers={"authorization": f"Bearer {ALICE}"}) as mine:
            assert mine.status == 200
            body = await mine.json()
    assert body["source"] == "recording" and len(body["timeline"]) == 1
    assert body["timeline"][0]["context"]["received"] > 0


async def test_an_invalid_redact_pattern_is_refused_and_the_old_policy_stays(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    path = tmp_path / "agentproxy.yaml"
    good = path.read_text()
    path.write_text(
        good.replace("record: {enabled: true}", "record: {redact: ['ok', '(unclosed']}")
    )
    async with aiohttp.ClientSession() as http:
        async with http.post(str(proxy.make_url("/admin/reload")), json={}) as reloaded:
            assert reloaded.status == 422
            details = (await reloaded.json())["error"]["details"]
    assert any("record.redact[1]" in line and "regular expression" in line for line in details)
    await chat(proxy).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "still recorded"}],
        extra_headers=session("after"),
    )  # fmt: skip
    assert len(await turns_of(proxy, "key:alice", "after")) == 1  # the old policy records


async def test_sessions_routes_without_recording_show_the_boards_timeline(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy = await start(
        start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}",
        record="{enabled: false}",
    )  # fmt: skip
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
    call = {"id": "call_1", "type": "function",
            "function": {"name": "read_file", "arguments": "{}"}}  # fmt: skip
    dangling = [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "user", "content": "well?"},
    ]  # a call without its result: repair patches it, an event of the turn
    await chat(proxy).chat.completions.create(
        model="sim", messages=dangling, tools=tools, extra_headers=session("plain")
    )
    async with aiohttp.ClientSession() as http:
        headers = {"authorization": f"Bearer {ALICE}"}
        async with http.get(str(proxy.make_url("/admin/sessions")), headers=headers) as listed:
            [row] = (await listed.json())["data"]
        assert row["session"] == "plain" and row["key"] == "alice" and row["turns"] == 1
        assert row["recorded"] is False and row["tokens_received"] > 0 and row["model"] == "sim"
        assert row["prompt_tokens"] > 0 and row["last_at"] >= row["first_at"]
        url = str(proxy.make_url(f"/admin/sessions/{row['id']}"))
        async with http.get(url, headers=headers) as shown:
            body = await shown.json()
        async with http.get(url, headers={"authorization": "Bearer sk-not-a-key-000"}) as bad:
            assert bad.status == 401
    assert body["source"] == "board"
    [turn] = body["timeline"]
    assert turn["status"] == 200 and turn["context"]["received"] > 0
    assert any(e["stage"] == "repair" for e in turn["events"])
    assert await recorded_turns(proxy.app[STORE], scoped("key:alice", "plain")) == []


async def test_an_edited_history_reads_back_as_sent_not_as_the_turn_before(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    """Messages taken from the previous turn only as far as the histories agree: a client
    that edits an earlier message (or drops one) is recorded as it sent the request."""
    proxy = await start(start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    one = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second"},
    ]
    edited = [one[0], {"role": "user", "content": "first, edited"}, *one[2:]]
    dropped = [one[0], *one[2:], {"role": "assistant", "content": "x"}]
    for history in (one, edited, dropped, one):
        await chat(proxy).chat.completions.create(
            model="sim", messages=history, extra_headers=session("edits")
        )
    turns = await turns_of(proxy, "key:alice", "edits", 4)
    assert [t["request"]["messages"] for t in turns] == [one, edited, dropped, one]
    assert [t["sent"]["messages"] for t in turns] == [one, edited, dropped, one]


async def post(
    proxy: TestServer, wire: str, body: dict[str, Any], name: str, **headers: str
) -> Any:
    """One turn of a native wire, its body sent as these bytes."""
    path, auth = (
        ("/v1/responses", {"authorization": f"Bearer {ALICE}"})
        if wire == "responses"
        else ("/v1/messages", {"x-api-key": ALICE, "anthropic-version": "2023-06-01"})
    )
    async with aiohttp.ClientSession() as http:
        async with http.post(
            str(proxy.make_url(path)),
            data=orjson_bytes(body),
            headers={"content-type": "application/json", **auth, **session(name), **headers},
        ) as response:
            assert response.status == 200, await response.text()
            return await response.json()


REASONING = {
    "model": "sim",
    "reasoning": {"effort": "low"},
    "include": ["reasoning.encrypted_content"],
    "store": False,
}
THINKING = {
    "model": "claude",
    "max_tokens": 2000,
    "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "omitted"},
}


def user(wire: str, text: str) -> dict[str, Any]:
    return {"role": "user", "content": text} if wire == "anthropic" else {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]
    }  # fmt: skip


async def _turn(
    proxy: TestServer,
    wire: str,
    history: list[dict[str, Any]],
    name: str,
    summary: bool = False,
    **headers: str,
) -> list[dict[str, Any]]:
    """Sends `history`; the answer as the next turn re-sends it (its signed reasoning too).
    With `summary`, a Responses turn's reasoning is sealed with its summary (other bytes)."""
    if wire == "responses":
        body = {**REASONING, "input": history}
        if summary:
            body["reasoning"] = {"effort": "low", "summary": "auto"}
        answer = await post(proxy, wire, body, name, **headers)
        return list(answer["output"])
    answer = await post(proxy, wire, {**THINKING, "messages": history}, name, **headers)
    return [{"role": "assistant", "content": answer["content"]}]


def _seal(wire: str, entries: list[dict[str, Any]]) -> str:
    """The first reasoning item's encrypted content (thinking block's signature) in `entries`."""
    if wire == "responses":
        return next(e["encrypted_content"] for e in entries if e.get("type") == "reasoning")
    blocks = (b for e in entries if isinstance(e["content"], list) for b in e["content"])
    return next(b["signature"] for b in blocks if b.get("type") == "thinking")


def _resign(wire: str, entry: dict[str, Any], seal: str) -> dict[str, Any]:
    """`entry` (a reasoning item, or an assistant message with a thinking block) with another
    valid encrypted content (signature): its chat view the same, its bytes not."""
    if wire == "responses":
        return {**entry, "encrypted_content": seal} if entry.get("type") == "reasoning" else entry
    if entry["role"] != "assistant":
        return entry
    content = [
        {**b, "signature": seal} if b.get("type") == "thinking" else b for b in entry["content"]
    ]
    return {**entry, "content": content}


@pytest.mark.parametrize("wire", ["responses", "anthropic"])
async def test_a_resigned_early_item_reads_back_with_its_new_bytes(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, wire: str
) -> None:
    """A native turn hashes only the items its view found new against the last turn's; an
    early reasoning item (thinking block) whose encrypted content (signature) changed, its
    chat view the same, is one of them: recorded as sent, not as the turn before had it."""
    proxy = await start(start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    key = "input" if wire == "responses" else "messages"
    one = [user(wire, "first")]
    two = [*one, *await _turn(proxy, wire, one, "signed"), user(wire, "second")]
    answer = await _turn(proxy, wire, two, "signed", summary=True)
    old, new = _seal(wire, two), _seal(wire, answer)
    assert old != new
    three = [*[_resign(wire, e, new) for e in two], *answer, user(wire, "third")]
    assert three[: len(two)] != two
    await _turn(proxy, wire, three, "signed")
    turns = await turns_of(proxy, "key:alice", "signed", 3)
    assert [t["request"][key] for t in turns] == [one, two, three]
    assert [t["sent"][key] for t in turns] == [one, two, three]
    assert _seal(wire, turns[2]["request"][key]) == new


@pytest.mark.parametrize("wire", ["responses", "anthropic"])
async def test_a_native_turn_after_an_unrecorded_one_hashes_it_all(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, wire: str
) -> None:
    """The view compares a turn with the session's last view, which may be a turn the
    recording never took (another policy, dropped, failed): then nothing is taken from the
    last recorded turn on the view's word, and what was sent is what reads back."""
    proxy = await start(start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    key = "input" if wire == "responses" else "messages"
    one = [user(wire, "first")]
    two = [*one, *await _turn(proxy, wire, one, "gap"), user(wire, "second")]
    answer = await _turn(proxy, wire, two, "gap", summary=True)
    edited = [*[_resign(wire, e, _seal(wire, answer)) for e in two], *answer]
    skipped = [*edited, user(wire, "unrecorded")]
    later = [*skipped, *await _turn(proxy, wire, skipped, "gap", **UNRECORDED), user(wire, "4")]
    await _turn(proxy, wire, later, "gap")
    turns = await turns_of(proxy, "key:alice", "gap", 3)
    assert [t["request"][key] for t in turns] == [one, two, later]


@pytest.mark.parametrize("wire", ["responses", "anthropic"])
async def test_native_turns_hash_their_new_items_only(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, wire: str
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    key = "input" if wire == "responses" else "messages"
    history = [user(wire, "step 0")]
    added = 1
    for step in range(1, 12):
        answer = await _turn(proxy, wire, history, "long")
        history += [*answer, user(wire, f"step {step}")]
        added += len(answer) + 1
    await _turn(proxy, wire, history, "long")
    turns = await turns_of(proxy, "key:alice", "long", 12)
    assert turns[-1]["request"][key] == history
    # each entry once (the reasoning items too), not the whole history every turn
    assert proxy.app[RECORDINGS].hashed <= added


UNRECORDED = {"x-agentproxy-policy": "unrecorded"}


async def test_a_stream_longer_than_the_recording_bound_is_not_kept_for_it(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    """Nothing else bounds a stream's total: the relay keeps a recorded session's stream only
    up to the session's recording bound, and the turn is recorded without its answer."""

    async def long_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for n in range(800):  # ~90 KB of events
            delta = {"content": f"word{n:04} " * 8}
            chunk = {"object": "chat.completion.chunk", "id": "c", "created": 0, "model": "sim",
                     "choices": [{"index": 0, "delta": delta}]}  # fmt: skip
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", long_stream)
    upstream: TestServer = await aiohttp_server(app)
    path = tmp_path / "agentproxy.yaml"
    record = "{enabled: true, max_mb_per_session: 0.02}"  # 20 KB
    where = f"path: {tmp_path / 'data'}"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), where, record=record))
    proxy = await start_proxy(path)
    stream = await chat(proxy).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "talk"}], stream=True,
        extra_headers=session("long"),
    )  # fmt: skip
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text.count("word0799") == 8  # the client got all of it
    (turn,) = await turns_of(proxy, "key:alice", "long")
    assert turn["request"]["messages"] == [{"role": "user", "content": "talk"}]
    assert turn.get("answer") is None
