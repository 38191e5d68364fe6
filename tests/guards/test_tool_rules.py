"""Tool-call rules (`guard.tool_calls`, proxy/guards/tool_rules.py) through the real
proxy over real sockets, with the real SDKs of every wire (openai chat and Responses,
anthropic, google-genai), whole and streamed: the simulator's model answers with a Bash call
to `rm -rf`; the client never gets it, reads why, and the answer does not end as tool use."""

from __future__ import annotations

import asyncio
import textwrap
import time
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer
from google import genai
from google.genai import types

from proxy.sim.simulator import Simulator
from proxy.state import EVENTS
from tests.conftest import ProxyFactory
from tests.support.scrape import metrics_of, sample

KEY = "sk-sim-upstream-secret"
RM = {"command": "rm -rf /home/agent/project", "description": "clean up"}
LS = {"command": "ls -la", "description": "list"}
READ = {"file_path": "/home/agent/notes.txt"}
WRITE = {"file_path": "/home/agent/todo.txt", "content": "one two three four five six seven"}
DENY_RM = """\
    policies:
      - name: guarded
        guard:
          {mode}
          tool_calls:
            - name: no-rm-rf
              match: {{tool: Bash, arguments: 'rm\\s+-rf'}}
              action: deny
              reason: recursive deletes are not allowed here
            - match: {{tool: /Read|Grep/, arguments: notes}}
              action: warn
    """
BASH_SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
    "required": ["command"],
}
READ_SCHEMA = {"type": "object", "properties": {"file_path": {"type": "string"}}}


def responder(chat: dict[str, Any]) -> dict[str, Any]:
    """Says a few words, then calls what the user's last words ask for: `rm` (Bash rm -rf),
    `ls` (Bash ls), `read` (Read), or several, space-separated."""
    words = _last_user_words(chat)
    calls = []
    for word in words:
        name, arguments = {
            "rm": ("Bash", RM),
            "ls": ("Bash", LS),
            "read": ("Read", READ),
            "write": ("Write", WRITE),
        }[word]
        calls.append(
            {
                "id": f"call_{len(calls)}",
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
            }
        )
    text = "I will take care of that now as you asked"
    return {"role": "assistant", "content": text, "tool_calls": calls}


def _last_user_words(chat: dict[str, Any]) -> list[str]:
    for message in reversed(chat.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content).split()
    return []


async def start(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, sim: Simulator, mode: str = ""
) -> tuple[TestServer, Path]:
    upstream = await aiohttp_server(sim.app())
    url = str(upstream.make_url("")).rstrip("/")
    text = f"""\
        store: {{path: {tmp_path / "state"}}}
        model_list:
          - model_name: sim
            litellm_params: {{model: openai/sim, api_base: {url}/v1, api_key: {KEY}}}
          - model_name: claude
            litellm_params: {{model: anthropic/claude-sim, api_base: {url}, api_key: {KEY}}}
          - model_name: gemini-native
            litellm_params: {{model: gemini/gemini-sim, api_base: {url}, api_key: {KEY}}}
        """
    path = tmp_path / "guard.yaml"
    path.write_text(textwrap.dedent(text) + textwrap.dedent(DENY_RM.format(mode=mode)))
    return await start_proxy(path), path


@pytest.fixture
def sim() -> Simulator:
    return Simulator(context_window=8192, api_key=KEY, responder=responder)


# --- one answer per wire, as the client's SDK reads it: (text, tool names, stop reason) ------

Answer = tuple[str, list[str], str | None, dict[str, str]]


async def chat(proxy: TestServer, words: str, stream: bool) -> Answer:
    tools: Any = [
        {"type": "function", "function": {"name": "Bash", "parameters": BASH_SCHEMA}},
        {"type": "function", "function": {"name": "Read", "parameters": READ_SCHEMA}},
    ]
    messages: Any = [{"role": "user", "content": words}]
    url = str(proxy.make_url("/v1"))
    async with openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
        if not stream:
            raw = await sdk.chat.completions.with_raw_response.create(
                model="sim", messages=messages, tools=tools
            )
            reply = raw.parse()
            message = reply.choices[0].message
            names = [c.function.name for c in message.tool_calls or []]  # type: ignore[union-attr]
            return message.content or "", names, reply.choices[0].finish_reason, dict(raw.headers)
        text, calls, finish = "", {}, None
        async with await sdk.chat.completions.create(
            model="sim", messages=messages, tools=tools, stream=True
        ) as chunks:
            async for chunk in chunks:
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    for call in choice.delta.tool_calls or []:
                        if call.function and call.function.name:
                            calls[call.index] = call.function.name
                    finish = choice.finish_reason or finish
        return text, [calls[i] for i in sorted(calls)], finish, {}


async def responses(proxy: TestServer, words: str, stream: bool) -> Answer:
    tools: Any = [
        {"type": "function", "name": "Bash", "parameters": BASH_SCHEMA, "strict": False},
        {"type": "function", "name": "Read", "parameters": READ_SCHEMA, "strict": False},
    ]
    url = str(proxy.make_url("/v1"))
    async with openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
        if not stream:
            raw = await sdk.responses.with_raw_response.create(
                model="sim", input=words, tools=tools
            )
            response = raw.parse()
            headers = dict(raw.headers)
        else:
            headers, streamed = {}, []
            async with await sdk.responses.create(
                model="sim", input=words, tools=tools, stream=True
            ) as events:
                async for event in events:
                    streamed.append(event)
            final = [e for e in streamed if e.type == "response.completed"]
            response = final[0].response  # type: ignore[union-attr]
            added = [e.item for e in streamed if e.type == "response.output_item.added"]  # type: ignore[union-attr]
            names = [i.name for i in added if i.type == "function_call"]
            assert names == [i.name for i in response.output if i.type == "function_call"]
            deltas = "".join(e.delta for e in streamed if e.type == "response.output_text.delta")  # type: ignore[union-attr]
            assert deltas == response.output_text  # the streamed text is the answer's
        names = [i.name for i in response.output if i.type == "function_call"]
        # Responses has no stop reason: an answer with no call is one the agent reads.
        finish = "tool_calls" if names else "stop"
        return response.output_text, names, finish, headers


async def messages(proxy: TestServer, words: str, stream: bool, model: str = "claude") -> Answer:
    tools: Any = [
        {"name": "Bash", "input_schema": BASH_SCHEMA},
        {"name": "Read", "input_schema": READ_SCHEMA},
    ]
    url = str(proxy.make_url(""))
    async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as sdk:
        asked: Any = [{"role": "user", "content": words}]
        if not stream:
            raw = await sdk.messages.with_raw_response.create(
                model=model, max_tokens=500, messages=asked, tools=tools
            )
            message = await raw.parse()
            headers = dict(raw.headers)
        else:
            headers = {}
            async with sdk.messages.stream(
                model=model, max_tokens=500, messages=asked, tools=tools
            ) as events:
                message = await events.get_final_message()
    text = "".join(b.text for b in message.content if b.type == "text")
    names = [b.name for b in message.content if b.type == "tool_use"]
    return text, names, message.stop_reason, headers


async def gemini(
    proxy: TestServer, words: str, stream: bool, model: str = "gemini-native"
) -> Answer:
    declarations = [
        types.FunctionDeclaration(name="Bash", parameters_json_schema=BASH_SCHEMA),
        types.FunctionDeclaration(name="Read", parameters_json_schema=READ_SCHEMA),
    ]
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=declarations)],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    options = types.HttpOptions(base_url=str(proxy.make_url("")).rstrip("/"))
    client = genai.Client(api_key="k", http_options=options)
    text, names, finish, headers = "", [], None, {}
    if not stream:
        response = await client.aio.models.generate_content(
            model=model, contents=words, config=config
        )
        chunks = [response]
        if response.sdk_http_response and response.sdk_http_response.headers:
            headers = dict(response.sdk_http_response.headers)
    else:
        chunks = [
            chunk
            async for chunk in await client.aio.models.generate_content_stream(
                model=model, contents=words, config=config
            )
        ]
    for chunk in chunks:
        candidate = (chunk.candidates or [None])[0]
        if candidate is None or candidate.content is None:
            continue
        for part in candidate.content.parts or []:
            text += part.text or ""
            if part.function_call is not None:
                names.append(part.function_call.name or "")
        finish = candidate.finish_reason or finish
    # Gemini ends a turn of calls with STOP too: an answer with no call is one the agent reads.
    return text, names, "tool_calls" if names else "stop", headers


async def messages_as_chat(proxy: TestServer, words: str, stream: bool) -> Answer:
    """Anthropic's client, a chat deployment: the answer translated."""
    return await messages(proxy, words, stream, model="sim")


async def gemini_as_chat(proxy: TestServer, words: str, stream: bool) -> Answer:
    return await gemini(proxy, words, stream, model="sim")


WIRES = {"chat": chat, "responses": responses, "messages": messages, "gemini": gemini}
TRANSLATED = {"messages-as-chat": messages_as_chat, "gemini-as-chat": gemini_as_chat}
TOOL_USE = {"tool_calls", "tool_use"}


def _events(proxy: TestServer, state: Path) -> list[dict[str, Any]]:
    proxy.app[EVENTS].flush()
    with (state / "events.jsonl").open() as lines:
        return [orjson.loads(line) for line in lines]


def _guard_events(proxy: TestServer, tmp_path: Path) -> list[tuple[str, str, str]]:
    return [
        (e["action"], e.get("tool", ""), e.get("rule", ""))
        for e in _events(proxy, tmp_path / "state")
        if e.get("stage") == "guard"
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("wire", [*WIRES, *TRANSLATED])
async def test_a_denied_rm_rf_never_reaches_the_client_and_the_answer_says_why(
    wire: str,
    stream: bool,
    start_proxy: ProxyFactory,
    aiohttp_server: Any,
    tmp_path: Path,
    sim: Simulator,
) -> None:
    proxy, _ = await start(start_proxy, aiohttp_server, tmp_path, sim)
    text, names, finish, headers = await (WIRES | TRANSLATED)[wire](proxy, "rm", stream)
    assert names == []
    assert finish not in TOOL_USE
    assert "I will take care of that" in text.replace("  ", " ")  # the model's own words pass
    assert "`Bash` was refused" in text and "recursive deletes are not allowed here" in text
    assert "rm -rf" not in text  # the refusal does not repeat the arguments
    if not stream:  # a stream's headers left before its answer was judged
        assert "guard.deny" in headers["x-agentproxy-applied"]
    assert _guard_events(proxy, tmp_path) == [("deny", "Bash", "no-rm-rf")]
    metrics = await metrics_of(proxy)
    assert sample(metrics, "agentproxy_guard_total", action="deny", rule="no-rm-rf") == 1
    assert len(sim.requests) == 1  # the model was asked once (its answer: the dry run's)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("wire", list(WIRES))
async def test_allowed_calls_beside_a_denied_one_are_kept_and_warned_ones_pass(
    wire: str,
    stream: bool,
    start_proxy: ProxyFactory,
    aiohttp_server: Any,
    tmp_path: Path,
    sim: Simulator,
) -> None:
    proxy, _ = await start(start_proxy, aiohttp_server, tmp_path, sim)
    text, names, finish, _ = await WIRES[wire](proxy, "ls rm read", stream)
    assert names == ["Bash", "Read"]  # ls and read: the rm between them taken out
    assert finish in TOOL_USE  # calls are left to run
    assert "`Bash` was refused" in text
    assert _guard_events(proxy, tmp_path) == [
        ("deny", "Bash", "no-rm-rf"),
        ("warn", "Read", "1"),
    ]
    metrics = await metrics_of(proxy)
    assert sample(metrics, "agentproxy_guard_total", action="warn", rule="1") == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("wire", list(WIRES))
async def test_a_call_passed_unheld_before_a_denied_one_still_ends_the_answer_as_tool_use(
    wire: str,
    stream: bool,
    start_proxy: ProxyFactory,
    aiohttp_server: Any,
    tmp_path: Path,
    sim: Simulator,
) -> None:
    """Write (no rule could match it) streams out before the Bash rm is held and denied: the
    answer still asks for Write to be run."""
    proxy, _ = await start(start_proxy, aiohttp_server, tmp_path, sim)
    text, names, finish, _ = await WIRES[wire](proxy, "write rm", stream)
    assert names == ["Write"] and finish in TOOL_USE
    assert "`Bash` was refused" in text


@pytest.mark.parametrize("wire", list(WIRES))
async def test_dry_run_changes_nothing_and_reports_would_deny(
    wire: str, start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, sim: Simulator
) -> None:
    proxy, _ = await start(start_proxy, aiohttp_server, tmp_path, sim, mode="mode: dry_run")
    text, names, finish, headers = await WIRES[wire](proxy, "rm", False)
    assert names == ["Bash"] and finish in TOOL_USE
    assert "refused" not in text
    assert "guard.would_deny" in headers["x-agentproxy-applied"]
    streamed = await WIRES[wire](proxy, "rm", True)
    assert streamed[1] == ["Bash"] and "refused" not in streamed[0]
    assert _guard_events(proxy, tmp_path) == [("would_deny", "Bash", "no-rm-rf")] * 2
    metrics = await metrics_of(proxy)
    assert sample(metrics, "agentproxy_guard_total", action="would_deny", rule="no-rm-rf") == 2
    assert sample(metrics, "agentproxy_guard_total", action="deny", rule="no-rm-rf") == 0


@pytest.mark.parametrize("wire", list(WIRES))
async def test_a_stream_whose_call_no_rule_could_match_is_not_held(
    wire: str, start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    """With rules on Bash and Read, an answer calling Write flows as it comes (the upstream
    slowed to 0.25 s an event): its text, and its call's first bytes, reach the client long
    before the upstream ends the stream. A Bash call is held: its first bytes come with the
    end (the control, which shows the measure can fail)."""
    sim = Simulator(context_window=8192, api_key=KEY, responder=responder, chunk_delay_s=0.25)
    proxy, _ = await start(start_proxy, aiohttp_server, tmp_path, sim)
    pieces = await _arrivals(proxy, wire, "write")
    end = pieces[-1][0]
    assert end - _first(pieces, b"take") > 1.0  # the text flowed
    if wire != "gemini":  # Gemini's call comes whole, in one chunk: nothing to hold back
        assert end - _first(pieces, b"Write") > 1.0
        held = await _arrivals(proxy, wire, "ls")
        assert held[-1][0] - _first(held, b"Bash") < 0.2
        assert held[-1][0] - _first(held, b"take") > 1.0


def _first(pieces: list[tuple[float, bytes]], mark: bytes) -> float:
    return next(at for at, data in pieces if mark in data)


async def _arrivals(proxy: TestServer, wire: str, words: str) -> list[tuple[float, bytes]]:
    """The streamed answer's bytes as they reached the client, each with its time."""
    bodies: dict[str, tuple[str, dict[str, Any]]] = {
        "chat": (
            "/v1/chat/completions",
            {"model": "sim", "stream": True, "messages": [{"role": "user", "content": words}],
             "tools": [{"type": "function", "function": {"name": "Write",
                                                          "parameters": READ_SCHEMA}}]},
        ),
        "responses": (
            "/v1/responses",
            {"model": "sim", "stream": True, "input": words,
             "tools": [{"type": "function", "name": "Write", "parameters": READ_SCHEMA}]},
        ),
        "messages": (
            "/v1/messages",
            {"model": "claude", "stream": True, "max_tokens": 100,
             "messages": [{"role": "user", "content": words}],
             "tools": [{"name": "Write", "input_schema": READ_SCHEMA}]},
        ),
        "gemini": (
            "/v1beta/models/gemini-native:streamGenerateContent?alt=sse",
            {"contents": [{"role": "user", "parts": [{"text": words}]}],
             "tools": [{"functionDeclarations": [{"name": "Write",
                                                  "parametersJsonSchema": READ_SCHEMA}]}]},
        ),
    }  # fmt: skip
    path, body = bodies[wire]
    pieces = []
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.make_url(path), json=body, headers={"x-goog-api-key": "k"}) as r:
            assert r.status == 200, await r.text()
            async for data in r.content.iter_any():
                pieces.append((time.perf_counter(), data))
    return pieces


async def test_rules_are_hot_reloaded(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, sim: Simulator
) -> None:
    proxy, path = await start(start_proxy, aiohttp_server, tmp_path, sim)
    assert (await chat(proxy, "rm", False))[1] == []
    path.write_text(path.read_text().replace("action: deny", "action: warn"))
    for _ in range(100):  # the watcher polls the file
        await asyncio.sleep(0.1)
        if (await chat(proxy, "rm", False))[1] == ["Bash"]:
            break
    else:
        pytest.fail("the changed rule never took effect")
