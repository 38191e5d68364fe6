"""The rewrite stages and guards on the Gemini wire, with the real `google-genai` SDK over real
sockets: repair of a call left unanswered, offload of a huge function response and its recall
answered inside the proxy (a native `gemini/` deployment, plain and streamed), a budget's
refusal in Google's error shape, and the recording of a streamed answer."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from google.genai import errors as genai_errors
from google.genai import types

from proxy.recording.sessions import recorded_turns
from proxy.sessions.identity import scoped
from proxy.sim.simulator import Simulator
from proxy.state import RECORDINGS, STORE
from tests.conftest import ProxyFactory

from .test_gemini import KEY, NO_AUTO, TOOLS, UPSTREAM_KEY, client, sim, start, upstream

__all__ = ["sim", "upstream"]  # the fixtures, shared

ASK = types.Content(role="user", parts=[types.Part(text='read_file({"path": "notes.txt"})')])
CALL = types.Content(
    role="model",
    parts=[types.Part(function_call=types.FunctionCall(name="read_file", args={"path": "a"}))],
)
CONFIG = types.GenerateContentConfig(tools=TOOLS, automatic_function_calling=NO_AUTO)


def result(output: str) -> types.Content:
    part = types.Part.from_function_response(name="read_file", response={"output": output})
    return types.Content(role="user", parts=[part])


@pytest.mark.parametrize("model", ["chat-model", "gemini-native"])
async def test_an_unanswered_call_is_repaired_before_the_provider_sees_it(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, sim: Simulator, model: str
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream)
    later = types.Content(role="user", parts=[types.Part(text="never mind, just say hi")])
    reply = await client(proxy).aio.models.generate_content(
        model=model, contents=[ASK, CALL, later], config=CONFIG
    )
    assert reply.text == "You said: never mind, just say hi"
    body = sim.requests[-1].body
    if model == "gemini-native":  # the twin refuses a call turn without its responses
        answered = body["contents"][2]["parts"]
        assert answered[0]["functionResponse"]["name"] == "read_file"
        assert "error" in answered[0]["functionResponse"]["response"]
        assert answered[1] == {"text": "never mind, just say hi"}
    else:
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool", "user"]


def recalling_model(body: dict[str, Any]) -> dict[str, Any]:
    """Looks the offloaded output up through the proxy's tool, then answers from it."""
    messages = body["messages"]
    last = messages[-1]
    said = str(last.get("content"))
    if last.get("role") == "tool" and "PINEAPPLE" in said and "reference: ap_" not in said:
        return {"role": "assistant", "content": f"FOUND: {str(last['content'])[:40]}"}
    pointer = next(m for m in messages if "reference: ap_" in str(m.get("content")))
    ref = re.search(r"reference: (ap_\w+)", str(pointer["content"])).group(1)  # type: ignore[union-attr]
    function = {"name": "agentproxy_recall", "arguments": f'{{"ref": "{ref}"}}'}
    return {"role": "assistant", "content": None, "tool_calls": [{"function": function}]}


@pytest.mark.parametrize("model", ["chat-model", "gemini-native"])
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_huge_response_is_offloaded_and_recalled_inside_the_proxy(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, model: str, streamed: bool
) -> None:
    sim = Simulator(api_key=UPSTREAM_KEY, responder=recalling_model)
    policies = "policies:\n  - name: tight\n    offload: {min_tokens: 500}\n"
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), policies=policies)
    content = "\n".join(f"line {i}: the launch code is PINEAPPLE" for i in range(600))
    history = [ASK, CALL, result(content)]
    sdk = client(proxy)
    if streamed:
        chunks = [
            c
            async for c in await sdk.aio.models.generate_content_stream(
                model=model, contents=history, config=CONFIG
            )
        ]
        text = "".join(c.text or "" for c in chunks)
        parts = [p for c in chunks for p in c.candidates[0].content.parts or ()]  # type: ignore[index, union-attr]
    else:
        reply = await sdk.aio.models.generate_content(model=model, contents=history, config=CONFIG)
        text = reply.text or ""
        parts = reply.candidates[0].content.parts or []  # type: ignore[index, union-attr]
    assert text.startswith("FOUND: line 0: the launch code is PINEAPPLE")
    assert not any(p.function_call for p in parts)  # the client never sees the proxy's call
    first, second = sim.requests[-2].body, sim.requests[-1].body
    if model == "gemini-native":
        sent = first["contents"][2]["parts"][0]["functionResponse"]["response"]["output"]
        assert "reference: ap_" in sent and len(sent) < len(content) // 4
        declared = [d["name"] for t in first["tools"] for d in t.get("functionDeclarations", [])]
        assert declared == ["read_file", "agentproxy_recall"]
        turn, answer = second["contents"][-2], second["contents"][-1]
        assert turn["parts"][0]["functionCall"]["name"] == "agentproxy_recall"
        assert turn["parts"][0]["thoughtSignature"].startswith("c2lt")  # sent back whole
        assert answer["parts"][0]["functionResponse"]["name"] == "agentproxy_recall"
    else:
        assert "reference: ap_" in first["messages"][2]["content"]
        assert second["messages"][-1]["role"] == "tool"


async def test_a_budget_refuses_in_googles_shape(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, sim: Simulator
) -> None:
    policies = "policies:\n  - name: metered\n    budgets: [{name: calls, limits: {calls: 1}}]\n"
    proxy = await start(start_proxy, tmp_path, upstream, policies=policies)
    sdk = client(proxy)
    options = types.GenerateContentConfig(
        http_options=types.HttpOptions(headers={"x-agentproxy-session": "g-1"})
    )
    await sdk.aio.models.generate_content(model="gemini-native", contents="hi", config=options)
    with pytest.raises(genai_errors.ClientError) as refused:
        await sdk.aio.models.generate_content(model="gemini-native", contents="hi", config=options)
    assert refused.value.code == 429 and refused.value.status == "RESOURCE_EXHAUSTED"
    details = refused.value.details["error"]["details"][0]
    assert details["reason"] == "budget_exceeded"
    assert len(sim.requests) == 1
    # Another key's session of the same name is its own.
    other = client(proxy, key="sk-proxy-gemini-2")
    await other.aio.models.generate_content(model="gemini-native", contents="hi", config=options)
    assert len(sim.requests) == 2
    assert KEY


async def test_turns_are_recorded_with_the_streamed_answer_assembled(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer
) -> None:
    policies = "policies:\n  - name: kept\n    record: {enabled: true}\n"
    proxy = await start(start_proxy, tmp_path, upstream, policies=policies)
    sdk = client(proxy)
    options = types.GenerateContentConfig(
        http_options=types.HttpOptions(headers={"x-agentproxy-session": "rec-1"})
    )
    for model in ("gemini-native", "chat-model"):
        chunks = [
            c.text or ""
            async for c in await sdk.aio.models.generate_content_stream(
                model=model, contents="say a few words please", config=options
            )
        ]
        assert len(chunks) > 1 or model == "chat-model"  # a translated answer: whole
    turns: list[dict[str, Any]] = []
    for _ in range(200):
        await proxy.app[RECORDINGS].flush()
        turns = await recorded_turns(proxy.app[STORE], scoped("key:agent", "rec-1"))
        if len(turns) >= 2:
            break
        await asyncio.sleep(0.01)
    assert [t["wire"] for t in turns] == ["gemini", "gemini"]
    for turn in turns:
        assert turn["request"]["contents"][0]["parts"] == [{"text": "say a few words please"}]
        assert turn["answer"]["candidates"][0]["content"]["parts"] == [
            {"text": "You said: say a few words please"}
        ]
        assert turn["answer"]["usageMetadata"]["promptTokenCount"] > 0
    assert KEY not in str(turns)
