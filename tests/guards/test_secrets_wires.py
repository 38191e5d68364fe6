"""Secrets scrubbed before the provider sees them, and given back in the answer: every wire
with its real SDK (openai chat and Responses, anthropic, google-genai), plain and streamed,
over real sockets in front of the simulator, whose model echoes the placeholder it was sent.
A second key naming the same session gets none of the first's secrets back."""

from __future__ import annotations

import asyncio
import re
import textwrap
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

from proxy.recording.sessions import recorded_turns
from proxy.sessions.identity import scoped
from proxy.sim.simulator import Simulator
from proxy.state import RECORDINGS, STORE
from tests.conftest import ProxyFactory

KEY, OTHER = "sk-proxy-guard-1", "sk-proxy-guard-2"
UPSTREAM_KEY = "sk-sim-up-guard"
AWS = "AKIAIOSFODNN7EXAMPLE"
ENV_VALUE = "hunter2-very-secret-value"
FILE = f"# .env\nAWS_ACCESS_KEY_ID={AWS}\nDB_PASSWORD={ENV_VALUE}\nDEBUG=true\n"
PLACEHOLDER = re.compile(r"«secret:[0-9a-f]{12}»")
SESSION = {"x-agentproxy-session": "guarded-1"}


def echoing_model(body: dict[str, Any]) -> dict[str, Any]:
    """Answers with every placeholder it was sent, as an agent's model would use them."""
    said = orjson.dumps(body["messages"]).decode()
    found = sorted(set(PLACEHOLDER.findall(said)))
    return {"role": "assistant", "content": "using " + " and ".join(found or ["nothing"])}


@pytest.fixture
def sim() -> Simulator:
    return Simulator(context_window=32768, api_key=UPSTREAM_KEY, responder=echoing_model)


async def start(start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer) -> TestServer:
    url = str(upstream.make_url("")).rstrip("/")
    text = f"""\
        store: {{path: {tmp_path / "state"}}}
        keys:
          api_keys: [{{name: agent, key: {KEY}}}, {{name: other, key: {OTHER}}}]
        model_list:
          - model_name: gpt-sim
            litellm_params: {{model: openai/sim, api_base: {url}/v1, api_key: {UPSTREAM_KEY}}}
          - model_name: claude-sim
            litellm_params:
              {{model: anthropic/claude-sim, api_base: {url}, api_key: {UPSTREAM_KEY}}}
          - model_name: gemini-sim
            litellm_params: {{model: gemini/gemini-sim, api_base: {url}, api_key: {UPSTREAM_KEY}}}
        policies:
          - name: guarded
            guard: {{secrets: {{scrub: true}}}}
            record: {{enabled: true}}
        """
    path = tmp_path / "guard.yaml"
    path.write_text(textwrap.dedent(text))
    return await start_proxy(path)


def base(proxy: TestServer) -> str:
    return str(proxy.make_url("")).rstrip("/")


async def ask_chat(proxy: TestServer, key: str, text: str, streamed: bool) -> str:
    sdk = openai.AsyncOpenAI(base_url=base(proxy) + "/v1", api_key=key, default_headers=SESSION)
    messages: Any = [{"role": "user", "content": text}]
    if not streamed:
        reply = await sdk.chat.completions.create(model="gpt-sim", messages=messages)
        return reply.choices[0].message.content or ""
    stream = await sdk.chat.completions.create(model="gpt-sim", messages=messages, stream=True)
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


async def ask_responses(proxy: TestServer, key: str, text: str, streamed: bool) -> str:
    sdk = openai.AsyncOpenAI(base_url=base(proxy) + "/v1", api_key=key, default_headers=SESSION)
    if not streamed:
        reply = await sdk.responses.create(model="gpt-sim", input=text)
        return reply.output_text
    stream = await sdk.responses.create(model="gpt-sim", input=text, stream=True)
    return "".join([e.delta async for e in stream if e.type == "response.output_text.delta"])


async def ask_anthropic(proxy: TestServer, key: str, text: str, streamed: bool) -> str:
    sdk = anthropic.AsyncAnthropic(base_url=base(proxy), api_key=key, default_headers=SESSION)
    messages: Any = [{"role": "user", "content": text}]
    if not streamed:
        reply = await sdk.messages.create(model="claude-sim", max_tokens=256, messages=messages)
        return "".join(b.text for b in reply.content if b.type == "text")
    async with sdk.messages.stream(model="claude-sim", max_tokens=256, messages=messages) as s:
        return "".join([piece async for piece in s.text_stream])


async def ask_gemini(proxy: TestServer, key: str, text: str, streamed: bool) -> str:
    options = types.HttpOptions(base_url=base(proxy), headers=SESSION)
    sdk = genai.Client(api_key=key, http_options=options)
    if not streamed:
        reply = await sdk.aio.models.generate_content(model="gemini-sim", contents=text)
        return reply.text or ""
    chunks = await sdk.aio.models.generate_content_stream(model="gemini-sim", contents=text)
    return "".join([c.text or "" async for c in chunks])


ASK = {
    "chat": ask_chat,
    "responses": ask_responses,
    "anthropic": ask_anthropic,
    "gemini": ask_gemini,
}


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("wire", list(ASK))
async def test_the_provider_never_sees_a_secret_and_the_client_gets_it_back(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    aiohttp_server: Any,
    sim: Simulator,
    wire: str,
    streamed: bool,
) -> None:
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()))
    answer = await ASK[wire](proxy, KEY, f"here is my env file:\n{FILE}", streamed)
    sent = orjson.dumps(sim.requests[-1].body).decode()
    assert AWS not in sent and ENV_VALUE not in sent
    assert len(set(PLACEHOLDER.findall(sent))) == 2  # DEBUG=true is no secret
    assert "DEBUG=true" in sent
    assert AWS in answer and ENV_VALUE in answer  # given back
    assert not PLACEHOLDER.search(answer)
    # The same secret, the same placeholder on the next turn: the cached prefix holds.
    await ASK[wire](proxy, KEY, f"again:\n{FILE}", streamed)
    again = orjson.dumps(sim.requests[-1].body).decode()
    assert set(PLACEHOLDER.findall(again)) == set(PLACEHOLDER.findall(sent))
    # A second key naming the same session cannot have the first's secrets given back.
    placeholders = " ".join(sorted(set(PLACEHOLDER.findall(sent))))
    theirs = await ASK[wire](proxy, OTHER, f"echo {placeholders}", streamed)
    assert AWS not in theirs and ENV_VALUE not in theirs
    assert PLACEHOLDER.search(theirs)
    # The recording holds the placeholders, not the secrets: request, sent body and answer.
    turns = await recorded(proxy, 2)
    for turn in turns:
        kept = orjson.dumps(turn).decode()
        assert AWS not in kept and ENV_VALUE not in kept
        assert len(set(PLACEHOLDER.findall(kept))) == 2
    assert PLACEHOLDER.search(orjson.dumps(turns[0]["answer"]).decode())


async def recorded(proxy: TestServer, count: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for _ in range(200):
        await proxy.app[RECORDINGS].flush()
        turns = await recorded_turns(proxy.app[STORE], scoped("key:agent", "guarded-1"))
        if len(turns) >= count:
            break
        await asyncio.sleep(0.01)
    assert len(turns) == count
    return turns


KEY_ARGS = orjson.dumps({"command": f"deploy --key {AWS}"}).decode()
READ_ARGS = orjson.dumps({"path": ".env"}).decode()


def chat_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "read .env"},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "read", READ_ARGS)]},
        {"role": "tool", "tool_call_id": "c1", "content": FILE},
        {
            "role": "assistant",
            "content": f"The key is {AWS}.",
            "tool_calls": [call("c2", "bash", KEY_ARGS)],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "deployed"},
        {"role": "user", "content": f"good; and {ENV_VALUE}?"},
    ]


def call(id_: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def anthropic_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "read .env"},
        {"role": "assistant", "content": [tool_use("c1", "read", {"path": ".env"})]},
        {"role": "user", "content": [result("c1", FILE)]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"The key is {AWS}."},
                tool_use("c2", "bash", {"command": f"deploy --key {AWS}"}),
            ],
        },
        {
            "role": "user",
            "content": [result("c2", "deployed"), {"type": "text", "text": f"and {ENV_VALUE}?"}],
        },
    ]


def tool_use(id_: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": name, "input": arguments}


def result(id_: str, text: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": id_, "content": [{"type": "text", "text": text}]}


def responses_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "read .env"},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": READ_ARGS},
        {"type": "function_call_output", "call_id": "c1", "output": FILE},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": f"The key is {AWS}."}],
        },
        {"type": "function_call", "call_id": "c2", "name": "bash", "arguments": KEY_ARGS},
        {"type": "function_call_output", "call_id": "c2", "output": "deployed"},
        {"role": "user", "content": f"and {ENV_VALUE}?"},
    ]


def gemini_history() -> list[dict[str, Any]]:
    def fcall(name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"functionCall": {"name": name, "args": args}}

    def fresp(name: str, output: str) -> dict[str, Any]:
        return {"functionResponse": {"name": name, "response": {"output": output}}}

    return [
        {"role": "user", "parts": [{"text": "read .env"}]},
        {"role": "model", "parts": [fcall("read", {"path": ".env"})]},
        {"role": "user", "parts": [fresp("read", FILE)]},
        {
            "role": "model",
            "parts": [{"text": f"The key is {AWS}."}, fcall("bash", {"command": f"deploy {AWS}"})],
        },
        {"role": "user", "parts": [fresp("bash", "deployed"), {"text": f"and {ENV_VALUE}?"}]},
    ]


async def post(proxy: TestServer, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.make_url(path), json=body, headers=headers) as response:
            assert response.status == 200, await response.text()
            return await response.json()


HISTORIES = {
    "chat": ("/v1/chat/completions", lambda: {"model": "gpt-sim", "messages": chat_history()}),
    "responses": ("/v1/responses", lambda: {"model": "gpt-sim", "input": responses_history()}),
    "anthropic": (
        "/v1/messages",
        lambda: {"model": "claude-sim", "max_tokens": 64, "messages": anthropic_history()},
    ),
    "gemini": (
        "/v1beta/models/gemini-sim:generateContent",
        lambda: {"contents": gemini_history()},
    ),
}


@pytest.mark.parametrize("wire", list(HISTORIES))
async def test_a_whole_history_goes_up_without_its_secrets(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, sim: Simulator, wire: str
) -> None:
    """Tool results, tool-call arguments, the model's earlier text (holding the secrets the
    client was given back) and the user's words: none reaches the provider, every wire."""
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()))
    path, body = HISTORIES[wire]
    headers = {**SESSION, "authorization": f"Bearer {KEY}", "x-goog-api-key": KEY}
    answer = await post(proxy, path, body(), headers)
    sent = orjson.dumps(sim.requests[-1].body).decode()
    assert AWS not in sent and ENV_VALUE not in sent, sent
    assert "deployed" in sent and "read .env" in sent
    said = orjson.dumps(answer).decode()
    assert AWS in said and ENV_VALUE in said  # the model's echo, given back
