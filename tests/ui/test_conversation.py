"""A recorded turn read as a conversation, over real sockets, in each of the four wires: the
timeline gives each call's new messages as the client sent them, the model's answer (text,
tool calls with their arguments parsed, stop reason) and, for a failed call, the error the
client got; calls that only carry tool results continue their client turn (`turn`, `calls`);
events an earlier call had are marked carried; long texts are cut with a marker."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Fault, Simulator
from proxy.state import RECORDINGS
from tests.conftest import ProxyFactory

ADMIN, ALICE, BOB = "admin-secret", "sk-alice-0001", "sk-bob-00002"
UPSTREAM_KEY = "sk-sim-upstream-secret"
ASK = 'read_file({"path": "notes.txt"})'
SYSTEM = "You are a careful agent."
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
LONG = "word " * 3_000  # 15,000 characters: cut in the timeline


def config(url: str, data: Path) -> str:
    return textwrap.dedent(
        f"""\
        keys:
          admin_key: {ADMIN}
          api_keys: [{{name: alice, key: {ALICE}}}, {{name: bob, key: {BOB}}}]
        store: {{path: {data}}}
        model_list:
          - model_name: sim
            litellm_params: {{model: openai/sim, api_base: "{url}/v1", api_key: {UPSTREAM_KEY}}}
          - model_name: claude
            litellm_params: {{model: anthropic/claude-sim, api_base: "{url}",
                              api_key: {UPSTREAM_KEY}}}
          - model_name: gemini-native
            litellm_params: {{model: gemini/gemini-sim, api_base: "{url}",
                              api_key: {UPSTREAM_KEY}}}
        policies:
          - name: recorded
            record: {{enabled: true, redact: ['SECRET-TOKEN-[0-9]+']}}
            offload: {{min_tokens: 500, preview_lines: 2}}
            retry: {{attempts: 1}}
        """
    )


class Agent:
    """One wire's agent: its route, headers, and how it writes a prompt, the model's answer
    and a tool's result into its history."""

    def __init__(self, wire: str, session: str) -> None:
        self.wire = wire
        self.session = session
        self.history: list[dict[str, Any]] = []

    def path(self) -> str:
        return {
            "chat": "/v1/chat/completions",
            "anthropic": "/v1/messages",
            "responses": "/v1/responses",
            "gemini": "/v1beta/models/gemini-native:generateContent",
        }[self.wire]

    def headers(self, key: str = ALICE) -> dict[str, str]:
        base = {"x-agentproxy-session": self.session}
        if self.wire == "anthropic":
            return {**base, "x-api-key": key, "anthropic-version": "2023-06-01"}
        if self.wire == "gemini":
            return {**base, "x-goog-api-key": key}
        return {**base, "Authorization": f"Bearer {key}"}

    def body(self) -> dict[str, Any]:
        if self.wire == "chat":
            tools = [{"type": "function", "function": {"name": "read_file", "parameters": SCHEMA}}]
            return {"model": "sim", "messages": [{"role": "system", "content": SYSTEM},
                                                 *self.history], "tools": tools}  # fmt: skip
        if self.wire == "anthropic":
            tools = [{"name": "read_file", "input_schema": SCHEMA}]
            return {"model": "claude", "max_tokens": 300, "system": SYSTEM,
                    "messages": self.history, "tools": tools}  # fmt: skip
        if self.wire == "responses":
            tools = [{"type": "function", "name": "read_file", "parameters": SCHEMA}]
            return {"model": "sim", "instructions": SYSTEM, "input": self.history,
                    "tools": tools}  # fmt: skip
        declarations = [{"name": "read_file", "parameters": SCHEMA}]
        return {"systemInstruction": {"parts": [{"text": SYSTEM}]}, "contents": self.history,
                "tools": [{"functionDeclarations": declarations}]}  # fmt: skip

    def prompt(self, text: str) -> None:
        if self.wire == "gemini":
            self.history.append({"role": "user", "parts": [{"text": text}]})
        else:
            self.history.append({"role": "user", "content": text})

    def answered(self, reply: dict[str, Any]) -> str | None:
        """The answer into the history; the id of the tool call it made, if one."""
        if self.wire == "chat":
            message = reply["choices"][0]["message"]
            self.history.append(message)
            return next((c["id"] for c in message.get("tool_calls") or ()), None)
        if self.wire == "anthropic":
            self.history.append({"role": "assistant", "content": reply["content"]})
            return next((b["id"] for b in reply["content"] if b["type"] == "tool_use"), None)
        if self.wire == "responses":
            self.history += reply["output"]
            calls = [i["call_id"] for i in reply["output"] if i["type"] == "function_call"]
            return calls[0] if calls else None
        content = reply["candidates"][0]["content"]
        self.history.append(content)
        calls = [p["functionCall"] for p in content["parts"] if "functionCall" in p]
        return (calls[0].get("id") or "read_file") if calls else None

    def result(self, call: str, text: str) -> None:
        if self.wire == "chat":
            self.history.append({"role": "tool", "tool_call_id": call, "content": text})
        elif self.wire == "anthropic":
            block = {"type": "tool_result", "tool_use_id": call, "content": text}
            self.history.append({"role": "user", "content": [block]})
        elif self.wire == "responses":
            self.history.append({"type": "function_call_output", "call_id": call, "output": text})
        else:
            answer: dict[str, Any] = {"name": "read_file", "response": {"output": text}}
            if call != "read_file":
                answer["id"] = call
            self.history.append({"role": "user", "parts": [{"functionResponse": answer}]})

    async def send(self, http: aiohttp.ClientSession, proxy: TestServer) -> tuple[int, Any]:
        url = proxy.make_url(self.path())
        async with http.post(url, json=self.body(), headers=self.headers()) as response:
            return response.status, await response.json()


async def start(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> tuple[TestServer, Simulator]:
    sim = Simulator(context_window=200_000, api_key=UPSTREAM_KEY)
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), tmp_path / "data"))
    return await start_proxy(path), sim


async def converse(proxy: TestServer, sim: Simulator, agent: Agent) -> str:
    """Two client turns, the first of two calls (a tool call, then its result), and a third
    that the upstream refuses: the error text the client got."""
    async with aiohttp.ClientSession() as http:
        agent.prompt(ASK)
        status, reply = await agent.send(http, proxy)
        assert status == 200, reply
        call = agent.answered(reply)
        assert call is not None, reply
        agent.result(call, "42 lines")
        status, reply = await agent.send(http, proxy)
        assert status == 200, reply
        agent.answered(reply)
        agent.prompt("Now summarize it.\n" + LONG)
        status, reply = await agent.send(http, proxy)
        assert status == 200, reply
        agent.answered(reply)
        agent.prompt("One more thing.")
        sim.inject(Fault(status=400))
        status, refused = await agent.send(http, proxy)
        assert status == 400, refused
    await proxy.app[RECORDINGS].flush()
    message = refused["error"]["message"]
    assert isinstance(message, str) and message
    return message


async def timeline(proxy: TestServer, session: str, key: str = ADMIN) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url("/admin/sessions"), headers=headers) as r:
            listed = (await r.json())["data"]
        ident = next(s["id"] for s in listed if s["session"] == session)
        async with http.get(proxy.make_url(f"/admin/sessions/{ident}"), headers=headers) as r:
            assert r.status == 200
            found: dict[str, Any] = await r.json()
            return found


def parts(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [p for p in message["parts"] if p["type"] == kind]


@pytest.mark.parametrize("wire", ["chat", "anthropic", "responses", "gemini"])
async def test_each_call_reads_as_its_new_messages_its_answer_and_its_error(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, wire: str
) -> None:
    proxy, sim = await start(start_proxy, aiohttp_server, tmp_path)
    refused = await converse(proxy, sim, Agent(wire, f"talk-{wire}"))
    session = await timeline(proxy, f"talk-{wire}")
    rows = session["timeline"]

    assert (session["turns"], session["calls"]) == (3, 4)
    assert [r["call"] for r in rows] == [1, 2, 3, 4]
    assert [r["turn"] for r in rows] == [1, 1, 2, 3]
    assert [r["opens"] for r in rows] == [True, False, True, True]
    # The first call: the system prompt and the user's ask; the model called the tool.
    first = rows[0]
    assert [m["role"] for m in first["messages_in"]] == ["system", "user"]
    assert parts(first["messages_in"][0], "text")[0]["text"] == SYSTEM
    assert parts(first["messages_in"][1], "text")[0]["text"] == ASK
    (called,) = parts(first["answer"], "tool_call")
    assert called["name"] == "read_file" and called["arguments"] == {"path": "notes.txt"}
    assert first["answer"]["stop"] and first["error"] is None
    # The second: only what is new (the model's call and the tool's result), then the answer.
    second = rows[1]
    roles = [m["role"] for m in second["messages_in"]]
    assert roles == ["assistant", "tool"], second["messages_in"]
    (result,) = parts(second["messages_in"][1], "tool_result")
    assert "42 lines" in str(result["content"])
    assert parts(second["answer"], "text")[0]["text"] == "read_file returned: 42 lines"
    # The third: the long prompt, cut with a marker saying where the whole one is.
    (prompt,) = parts(second_last_user(rows[2]), "text")
    assert prompt["text"].startswith("Now summarize it.") and len(prompt["text"]) < 5_000
    assert "?full=1" in prompt["text"]
    # The refused one: the status and the error text the client got.
    failed = rows[3]
    assert failed["status"] == 400 and failed["answer"] is None
    assert failed["error"]["status"] == 400 and failed["error"]["by"] == "upstream"
    assert failed["error"]["message"] == refused


def second_last_user(row: dict[str, Any]) -> dict[str, Any]:
    users = [m for m in row["messages_in"] if m["role"] == "user"]
    return users[-1]


async def test_a_rewrite_carried_from_an_earlier_call_is_marked_apart_from_a_new_one(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy, _ = await start(start_proxy, aiohttp_server, tmp_path)
    log = "\n".join(f"line {i}: the server's log" for i in range(600))
    agent = Agent("chat", "carried")
    async with aiohttp.ClientSession() as http:
        agent.prompt(ASK)
        _, reply = await agent.send(http, proxy)
        call = agent.answered(reply)
        assert call is not None
        agent.result(call, log)  # offloaded on this call
        _, reply = await agent.send(http, proxy)
        agent.answered(reply)
        agent.prompt("And then?")  # the same offload, carried on
        status, _ = await agent.send(http, proxy)
        assert status == 200
    await proxy.app[RECORDINGS].flush()
    rows = (await timeline(proxy, "carried"))["timeline"]
    offloads = [[e for e in r["events"] if e["stage"] == "offload"] for r in rows]
    assert offloads[0] == []
    assert [(e["new"], e["carried"]) for e in offloads[1]] == [(True, 0)]
    assert [(e["new"], e["carried"]) for e in offloads[2]] == [(False, 1)]
    assert offloads[1][0]["refs"] == offloads[2][0]["refs"]
    # A page that starts past the offload's call still knows it was carried.
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url("/admin/sessions"), headers=headers) as r:
            ident = (await r.json())["data"][0]["id"]
        url = proxy.make_url(f"/admin/sessions/{ident}?after=2")
        async with http.get(url, headers=headers) as r:
            (row,) = (await r.json())["timeline"]
    assert [e["new"] for e in row["events"] if e["stage"] == "offload"] == [False]


async def test_another_key_with_the_same_session_id_sees_only_its_own_conversation(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy, sim = await start(start_proxy, aiohttp_server, tmp_path)
    await converse(proxy, sim, Agent("chat", "shared"))
    bobs = Agent("chat", "shared")
    async with aiohttp.ClientSession() as http:
        bobs.prompt("bob's own question")
        url = proxy.make_url(bobs.path())
        async with http.post(url, json=bobs.body(), headers=bobs.headers(BOB)) as r:
            assert r.status == 200
    await proxy.app[RECORDINGS].flush()
    mine = await timeline(proxy, "shared", BOB)
    assert (mine["turns"], mine["calls"]) == (1, 1)
    said = [p["text"] for m in mine["timeline"][0]["messages_in"] for p in parts(m, "text")]
    assert said == [SYSTEM, "bob's own question"]
    alices = await timeline(proxy, "shared", ALICE)
    assert alices["calls"] == 4


async def test_a_proxy_error_a_broken_stream_and_a_secret_in_an_upstream_error_are_told(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy, sim = await start(start_proxy, aiohttp_server, tmp_path)
    agent = Agent("chat", "failures")
    said: list[Any] = []
    async with aiohttp.ClientSession() as http:
        agent.prompt("first")
        sim.inject(Fault(reset=True))  # the upstream hangs up: the proxy's own error
        said.append(await agent.send(http, proxy))
        agent.prompt("second")
        leak = {"error": {"message": "key SECRET-TOKEN-8472913 is revoked", "type": "auth"}}
        sim.inject(Fault(status=400, body=leak))
        said.append(await agent.send(http, proxy))
        agent.prompt("third, streamed")
        sim.inject(Fault(cut_after_chunks=2))  # the stream breaks after it began
        url = proxy.make_url(agent.path())
        body = {**agent.body(), "stream": True}
        async with http.post(url, json=body, headers=agent.headers()) as response:
            assert response.status == 200
            await response.read()
    await proxy.app[RECORDINGS].flush()
    rows = (await timeline(proxy, "failures"))["timeline"]
    refused, leaked, broken = (row["error"] for row in rows)
    assert said[0][0] == refused["status"] >= 500 and refused["by"] == "proxy"
    assert refused["message"] == said[0][1]["error"]["message"] and refused["type"]
    assert said[1][0] == leaked["status"] == 400 and leaked["by"] == "upstream"
    assert leaked["message"] == "key [redacted] is revoked"
    assert broken["by"] == "stream" and broken["status"] >= 500 and broken["message"]
    assert rows[2]["status"] == broken["status"]


async def test_a_cache_breakpoint_moved_off_the_prompt_does_not_open_a_turn(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    """Claude Code marks its newest message as a cache breakpoint: on the next call the prompt
    comes back without the marker (new to the recording), followed by the tool's result."""
    proxy, _ = await start(start_proxy, aiohttp_server, tmp_path)
    agent = Agent("anthropic", "breakpoints")
    mark = {"type": "ephemeral"}
    async with aiohttp.ClientSession() as http:
        agent.history.append(
            {"role": "user", "content": [{"type": "text", "text": ASK, "cache_control": mark}]}
        )
        status, reply = await agent.send(http, proxy)
        assert status == 200, reply
        call = agent.answered(reply)
        assert call is not None
        agent.history[0] = {"role": "user", "content": [{"type": "text", "text": ASK}]}
        block = {"type": "tool_result", "tool_use_id": call, "content": "42 lines",
                 "cache_control": mark}  # fmt: skip
        agent.history.append({"role": "user", "content": [block]})
        status, reply = await agent.send(http, proxy)
        assert status == 200, reply
    await proxy.app[RECORDINGS].flush()
    session = await timeline(proxy, "breakpoints")
    assert (session["turns"], session["calls"]) == (1, 2)
    second = session["timeline"][1]
    assert second["opens"] is False
    # The whole list is new to the recording (its first message changed): the system prompt too.
    roles = [m["role"] for m in second["messages_in"]]
    assert roles == ["system", "user", "assistant", "tool"]


async def test_client_turns_count_on_in_another_process_on_the_same_store(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    """A second proxy on the store (a restart, a replica) reads where the count stood: a
    tool's result it sees first continues the turn, the next prompt opens the next one."""
    first, _ = await start(start_proxy, aiohttp_server, tmp_path)
    agent = Agent("chat", "lasting")
    async with aiohttp.ClientSession() as http:
        agent.prompt(ASK)
        _, reply = await agent.send(http, first)
        call = agent.answered(reply)
        assert call is not None
        await first.app[RECORDINGS].flush()
        second, _ = await start(start_proxy, aiohttp_server, tmp_path)
        agent.result(call, "42 lines")
        _, reply = await agent.send(http, second)
        agent.answered(reply)
        agent.prompt("And then?")
        status, _ = await agent.send(http, second)
        assert status == 200
    await second.app[RECORDINGS].flush()
    session = await timeline(second, "lasting")
    assert (session["turns"], session["calls"]) == (2, 3)
    assert [r["turn"] for r in session["timeline"]] == [1, 1, 2]


@pytest.mark.parametrize("wire", ["chat", "anthropic", "responses", "gemini"])
async def test_the_board_counts_client_turns_and_calls_as_the_index_does(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, wire: str
) -> None:
    """The same conversation through a proxy that records it (listed from the store's
    index) and one that does not (from the board): the same turns and calls, the same
    client turn on every call."""
    recorded, sim = await start(start_proxy, aiohttp_server, tmp_path)
    await converse(recorded, sim, Agent(wire, "counted"))
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "unrecorded.yaml"
    url = str(upstream.make_url("")).rstrip("/")
    text = config(url, tmp_path / "unrecorded").replace("{enabled: true,", "{enabled: false,")
    path.write_text(text)
    unrecorded = await start_proxy(path)
    await converse(unrecorded, sim, Agent(wire, "counted"))
    indexed, boarded = await timeline(recorded, "counted"), await timeline(unrecorded, "counted")
    assert indexed["source"] == "recording" and boarded["source"] == "board"
    assert (boarded["turns"], boarded["calls"]) == (indexed["turns"], indexed["calls"]) == (3, 4)
    calls = [(row["call"], row["turn"], row["opens"]) for row in boarded["timeline"]]
    assert calls == [(row["call"], row["turn"], row["opens"]) for row in indexed["timeline"]]
    assert calls == [(1, 1, True), (2, 1, False), (3, 2, True), (4, 3, True)]
    async with aiohttp.ClientSession() as http:
        for proxy, source in ((recorded, "recording"), (unrecorded, "board")):
            headers = {"Authorization": f"Bearer {ADMIN}"}
            async with http.get(proxy.make_url("/admin/sessions"), headers=headers) as r:
                (row,) = (await r.json())["data"]
            assert (row["source"], row["turns"], row["calls"]) == (source, 3, 4)


class Counting:
    """A wire's Conversation that counts the entries read through it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.read = inner, 0

    def messages(self, items: list[Any]) -> Any:
        self.read += len(items)
        return self.inner.messages(items)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("wire", ["chat", "anthropic"])
async def test_the_board_reads_a_calls_last_entries_not_its_history(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, wire: str
) -> None:
    """On the request's path: whether a call opens a client turn costs its newest entries,
    however long the history grows (and, once, its opening: whether later calls are side
    calls)."""
    sim = Simulator(context_window=2_000_000, api_key=UPSTREAM_KEY)
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    url = str(upstream.make_url("")).rstrip("/")
    path.write_text(config(url, tmp_path / "data").replace("{enabled: true,", "{enabled: false,"))
    proxy = await start_proxy(path)
    conversations = proxy.app[RECORDINGS].conversations  # the recorder's too: one map
    counting = Counting(conversations[wire])
    conversations[wire] = counting  # type: ignore[index]
    agent = Agent(wire, "long")
    agent.prompt("Read every file.")
    for i in range(150):  # a long history of the agent's calls, sent once
        agent.history += [{"role": "assistant", "content": f"step {i}"},
                          {"role": "user", "content": f"go on {i}"}]  # fmt: skip
    reads, prompts = [], 1
    async with aiohttp.ClientSession() as http:
        for i in range(5):
            before = counting.read
            status, reply = await agent.send(http, proxy)
            assert status == 200, reply
            reads.append(counting.read - before)
            call = agent.answered(reply)
            if call is not None:
                agent.result(call, "42 lines")  # the next call continues the turn
            elif i < 4:
                agent.prompt("Next.")
                prompts += 1
    # The last entry the client wrote, and no more; the first call also its opening (the
    # leading entries up to its first user message: recording/conversation.py, MainLine).
    assert max(reads[1:]) <= 2 and reads[0] <= 2 + 2, reads
    (row,) = await listed(proxy)
    assert (row["turns"], row["calls"]) == (prompts, 5)


async def listed(proxy: TestServer) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        async with http.get(proxy.make_url("/admin/sessions"), headers=headers) as r:
            rows: list[dict[str, Any]] = (await r.json())["data"]
            return rows


class Unreadable:
    """A wire's Conversation that cannot read an entry."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def messages(self, items: list[Any]) -> Any:
        raise ValueError("an entry this reader cannot read")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_call_the_board_cannot_read_is_answered_and_counted_as_a_turn(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    """The board reads each call on the request's path: a failing reading is never the
    request's failure."""
    sim = Simulator(context_window=200_000, api_key=UPSTREAM_KEY)
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    url = str(upstream.make_url("")).rstrip("/")
    path.write_text(config(url, tmp_path / "data").replace("{enabled: true,", "{enabled: false,"))
    proxy = await start_proxy(path)
    conversations = proxy.app[RECORDINGS].conversations
    conversations["chat"] = Unreadable(conversations["chat"])  # type: ignore[index]
    agent = Agent("chat", "unreadable")
    async with aiohttp.ClientSession() as http:
        for text in ("one", "two"):
            agent.prompt(text)
            status, reply = await agent.send(http, proxy)
            assert status == 200, reply
            agent.answered(reply)
    (row,) = await listed(proxy)
    assert (row["turns"], row["calls"]) == (2, 2)
