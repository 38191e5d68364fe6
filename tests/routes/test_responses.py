"""POST /v1/responses through the real proxy with the `openai` SDK, over real sockets, against
the strict Responses twin: JSON and streams, tool loops, repairs, offload, overflow, encrypted
reasoning returned untouched, previous_response_id left alone, and OpenAI-shaped errors."""

from __future__ import annotations

import re
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory

KEY = "sk-proxy-responses-1"
UPSTREAM_KEY = "sk-sim-upstream-secret"
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ASK: list[Any] = [{"role": "user", "content": "what is the weather? use get_weather"}]
OPENED: list[openai.AsyncOpenAI] = []


async def start(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    *,
    window: int = 8192,
    policies: str = "",
) -> TestServer:
    url = str(upstream.make_url("")).rstrip("/")
    text = f"""\
        store: {{path: {tmp_path / "state"}}}
        keys:
          api_keys: [{{name: agent, key: {KEY}}}]
        model_list:
          - model_name: gpt
            litellm_params:
              model: openai/gpt-sim
              api_base: {url}/v1
              api_key: {UPSTREAM_KEY}
            model_info:
              max_input_tokens: {window}
          - model_name: local
            litellm_params:
              model: hosted_vllm/local
              api_base: {url}/v1
              api_key: {UPSTREAM_KEY}
        """
    path = tmp_path / "responses.yaml"
    path.write_text(textwrap.dedent(text) + textwrap.dedent(policies))
    return await start_proxy(path)


def client(proxy: TestServer, key: str = KEY) -> openai.AsyncOpenAI:
    sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key=key, max_retries=0)
    OPENED.append(sdk)
    return sdk


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while OPENED:
        await OPENED.pop().close()


@pytest.fixture
def sim() -> Simulator:
    return Simulator(api_key=UPSTREAM_KEY)


@pytest.fixture
async def proxy(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, sim: Simulator
) -> TestServer:
    return await start(start_proxy, tmp_path, await aiohttp_server(sim.app()))


def dumped(items: Any) -> list[dict[str, Any]]:
    return [item.model_dump(exclude_none=True) for item in items]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_loop_goes_through_natively(
    proxy: TestServer, sim: Simulator, stream: bool
) -> None:
    sdk = client(proxy)
    headers = {"session-id": "codex-thread-1"}
    first = await sdk.responses.create(
        model="gpt", input=ASK, tools=[WEATHER], extra_headers=headers
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    history = [
        *ASK,
        *dumped(first.output),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    if stream:
        async with sdk.responses.stream(
            model="gpt", input=history, tools=[WEATHER], extra_headers=headers
        ) as events:
            seen = [event.type async for event in events]
            second = await events.get_final_response()
        assert seen[0] == "response.created" and seen[-1] == "response.completed"
    else:
        second = await sdk.responses.create(
            model="gpt", input=history, tools=[WEATHER], extra_headers=headers
        )
    assert "sunny" in second.output_text
    sent = sim.requests[-1]
    assert sent.path == "/v1/responses" and sent.api_key == UPSTREAM_KEY
    assert sent.body["input"] == history and sent.body["tools"] == [WEATHER]
    assert second.usage is not None and second.usage.output_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_without_its_output_is_repaired(
    proxy: TestServer, sim: Simulator, stream: bool
) -> None:
    history: list[Any] = [
        *ASK,
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"role": "user", "content": "never mind, just say hi"},
    ]
    sdk = client(proxy)
    if stream:
        async with sdk.responses.stream(model="gpt", input=history, tools=[WEATHER]) as events:
            reply = await events.get_final_response()
    else:
        reply = await sdk.responses.create(model="gpt", input=history, tools=[WEATHER])
    assert reply.output_text
    sent = sim.requests[-1].body["input"]
    assert sent[2]["type"] == "function_call_output" and sent[2]["call_id"] == "call_1"
    assert "did not complete" in sent[2]["output"]


PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"
APPLY_PATCH: dict[str, Any] = {  # Codex's freeform tool: a grammar, no JSON schema
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch"'},
}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_custom_tool_input_is_free_text_and_only_bad_json_is_flagged(
    proxy: TestServer, sim: Simulator, stream: bool
) -> None:
    """A custom tool call carries free text (a patch, code), not JSON arguments: repair leaves
    it alone, while a function call whose arguments do not parse is still flagged."""
    history: list[Any] = [
        *ASK,
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Success."},
        {"type": "function_call", "call_id": "call_w", "name": "get_weather", "arguments": "{ci"},
        {"type": "function_call_output", "call_id": "call_w", "output": "sunny"},
    ]
    sdk = client(proxy)
    tools: Any = [WEATHER, APPLY_PATCH]
    if stream:
        async with sdk.responses.with_streaming_response.create(
            model="gpt", input=history, tools=tools, stream=True
        ) as raw:
            applied = raw.headers["x-agentproxy-applied"]
            await raw.read()
    else:
        raw = await sdk.responses.with_raw_response.create(model="gpt", input=history, tools=tools)
        applied = raw.headers["x-agentproxy-applied"]
        assert raw.parse().output_text
    assert "repair.flagged_bad_arguments;count=1" in applied
    sent = sim.requests[-1].body
    assert sent["input"][:3] == history[:3]  # the patch and its output as the client sent them
    assert "not valid JSON" in sent["input"][4]["output"]
    assert sent["tools"] == tools


async def test_old_patches_of_a_custom_tool_are_truncated_near_the_window(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, sim: Simulator
) -> None:
    """Codex's apply_patch carries each file body in a custom call's free-text input: near the
    window, old ones become their head and a reference, still custom calls, stored whole."""
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), window=10_000)
    patches = [PATCH + "+" + "x" * 6_000 for _ in range(6)]
    history: list[Any] = [{"role": "user", "content": "write the six files"}]
    for i, patch in enumerate(patches):
        call = {"type": "custom_tool_call", "call_id": f"p{i}", "name": "apply_patch"}
        history += [
            {**call, "input": f"{i}{patch}"},
            {"type": "custom_tool_call_output", "call_id": f"p{i}", "output": "Success."},
        ]
    raw = await client(proxy).responses.with_raw_response.create(
        model="gpt", input=history, tools=[APPLY_PATCH]
    )
    assert raw.http_response.status_code == 200
    applied = raw.headers["x-agentproxy-applied"]
    assert "compaction.truncated_arguments" in applied and "flagged" not in applied
    sent = sim.requests[-1].body["input"]
    calls = [item for item in sent if item.get("type") == "custom_tool_call"]
    assert [c["call_id"] for c in calls] == [f"p{i}" for i in range(6)]
    short = [c for c in calls if "chars truncated" in c["input"]]
    assert short and calls[-1] not in short  # the newest stays whole
    async with aiohttp.ClientSession() as http:
        for item in short:
            original = history[1 + 2 * int(item["call_id"][1:])]["input"]
            head, _, marker = item["input"].partition("… [agentproxy] ")
            assert original.startswith(head) and len(head) == 200
            ref = marker.split("archived as ")[1].split(" ")[0]
            url = str(proxy.make_url(f"/v1/agentproxy/archive/{ref}"))
            async with http.get(url, headers={"Authorization": f"Bearer {KEY}"}) as r:
                assert r.status == 200 and (await r.json())["content"] == original


async def test_a_huge_output_is_offloaded_and_readable(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, sim: Simulator
) -> None:
    policies = "policies:\n  - name: tight\n    offload: {min_tokens: 500}\n"
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), policies=policies)
    content = "\n".join(f"line {i}: filler text for the test" for i in range(600))
    history: list[Any] = [
        *ASK,
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": content},
    ]
    raw = await client(proxy).responses.with_raw_response.create(
        model="gpt", input=history, tools=[WEATHER]
    )
    assert "offload.offloaded;count=1" in raw.headers["x-agentproxy-applied"]
    body = sim.requests[-1].body
    pointer = body["input"][2]
    assert pointer["type"] == "function_call_output" and pointer["call_id"] == "call_1"
    ref = re.search(r"reference: (ap_\w+)", pointer["output"]).group(1)  # type: ignore[union-attr]
    recall_tool = body["tools"][-1]
    assert recall_tool["type"] == "function" and recall_tool["name"] == "agentproxy_recall"
    async with aiohttp.ClientSession() as http:
        url = str(proxy.make_url(f"/v1/agentproxy/archive/{ref}"))
        async with http.get(url, headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status == 200 and (await r.json())["content"] == content


async def test_an_overflow_is_compacted_and_retried(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    sim = Simulator(api_key=UPSTREAM_KEY, context_window=3000)
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), window=100_000)
    history: list[Any] = [{"role": "user", "content": "Port the parser to Rust."}]
    for i in range(12):
        history.append(
            {"type": "function_call", "call_id": f"c{i}", "name": "get_weather", "arguments": "{}"}
        )
        history.append(
            {"type": "function_call_output", "call_id": f"c{i}", "output": "x=1\n" * 300}
        )
    raw = await client(proxy).responses.with_raw_response.create(
        model="gpt", input=history, tools=[WEATHER]
    )
    assert raw.http_response.status_code == 200
    assert "compaction.overflow_compacted" in raw.headers["x-agentproxy-applied"]
    assert len(sim.requests[-1].body["input"]) < len(history)


async def test_encrypted_reasoning_goes_back_untouched(proxy: TestServer, sim: Simulator) -> None:
    sdk = client(proxy)
    include: Any = ["reasoning.encrypted_content"]
    first = await sdk.responses.create(
        model="gpt", input=ASK, tools=[WEATHER], store=False, include=include
    )
    assert first.output[0].type == "reasoning"
    [call] = [item for item in first.output if item.type == "function_call"]
    history = [
        *ASK,
        *dumped(first.output),
        {"type": "function_call_output", "call_id": call.call_id, "output": "rain"},
    ]
    await sdk.responses.create(
        model="gpt", input=history, tools=[WEATHER], store=False, include=include
    )
    assert sim.requests[-1].status == 200  # the twin checked the seal
    assert sim.requests[-1].body["input"][1] == history[1]


async def test_previous_response_id_is_passed_through_untouched(
    proxy: TestServer, sim: Simulator
) -> None:
    sdk = client(proxy)
    first = await sdk.responses.create(model="gpt", input=ASK, tools=[WEATHER])
    [call] = [item for item in first.output if item.type == "function_call"]
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = await sdk.responses.create(
        model="gpt", input=[answer], tools=[WEATHER], previous_response_id=first.id
    )
    assert "sunny" in second.output_text
    sent = sim.requests[-1].body  # not "repaired": its call lives at the provider
    assert sent["input"] == [answer] and sent["previous_response_id"] == first.id


@pytest.mark.parametrize("stream", [False, True])
async def test_a_deployment_without_responses_is_answered_by_translation(
    proxy: TestServer, sim: Simulator, stream: bool
) -> None:
    """`local` (hosted_vllm) lacks Responses: the view goes out as Chat Completions, the
    reply comes back as a response (streamed as Responses' events once whole)."""
    sdk = client(proxy)
    if stream:
        async with sdk.responses.stream(model="local", input=ASK, tools=[WEATHER]) as events:
            reply = await events.get_final_response()
    else:
        reply = await sdk.responses.create(model="local", input=ASK, tools=[WEATHER])
    [call] = [item for item in reply.output if item.type == "function_call"]
    assert call.name == "get_weather" and '"city"' in call.arguments
    sent = sim.requests[-1]
    assert sent.path == "/v1/chat/completions" and "stream" not in sent.body
    assert sent.body["tools"] == [
        {
            "type": "function",
            "function": {k: WEATHER[k] for k in ("name", "description", "parameters")},
        }
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_custom_tool_goes_to_a_chat_deployment_as_a_function_of_its_text(
    proxy: TestServer, sim: Simulator, stream: bool
) -> None:
    """Translated to chat, a custom tool is a function taking its free text as `input`: the
    history's custom call goes as its JSON, and the model's call of it comes back as a custom
    tool call whose input is that text."""
    history: list[Any] = [
        {"role": "user", "content": "add hello.txt"},
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Success."},
        {"role": "user", "content": "again: use apply_patch"},
    ]
    sdk = client(proxy)
    if stream:
        async with sdk.responses.stream(
            model="local", input=history, tools=[APPLY_PATCH]
        ) as events:
            seen = [event.type async for event in events]
            reply = await events.get_final_response()
        assert "response.custom_tool_call_input.done" in seen
    else:
        reply = await sdk.responses.create(model="local", input=history, tools=[APPLY_PATCH])
    [call] = [item for item in reply.output if item.type == "custom_tool_call"]
    assert call.name == "apply_patch" and isinstance(call.input, str) and call.input
    assert not call.input.startswith("{")  # the text itself, not the function's JSON
    sent = sim.requests[-1]
    assert sent.path == "/v1/chat/completions"
    [tool] = sent.body["tools"]
    assert tool["function"]["name"] == "apply_patch"
    assert tool["function"]["parameters"]["required"] == ["input"]
    assert "lark grammar" in tool["function"]["parameters"]["properties"]["input"]["description"]
    [old] = sent.body["messages"][1]["tool_calls"]
    assert old["type"] == "function" and orjson.loads(old["function"]["arguments"]) == {
        "input": PATCH
    }


HI = [{"role": "user", "content": "x"}]


def body(**fields: Any) -> bytes:
    return orjson.dumps({"model": "gpt", "input": HI, **fields})


BAD_INPUT: dict[str, tuple[bytes, int]] = {
    "truncated JSON": (b'{"model": "gpt", "inp', 400),
    "not an object": (b"[1]", 400),
    "no input": (orjson.dumps({"model": "gpt"}), 400),
    "input a number": (body(input=5), 400),
    "item not an object": (body(input=[1]), 400),
    "bad role": (body(input=[{"role": "bot", "content": "x"}]), 400),
    "call without call_id": (body(input=[{"type": "function_call", "name": "f"}]), 400),
    "tools not a list": (body(tools={}), 400),
    "unknown model": (body(model="nope"), 404),
}


@pytest.mark.parametrize("raw, status", BAD_INPUT.values(), ids=list(BAD_INPUT))
async def test_bad_input_gets_an_openai_error_and_the_next_request_succeeds(
    proxy: TestServer, raw: bytes, status: int
) -> None:
    url = str(proxy.make_url("/v1/responses"))
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=raw, headers=headers) as r:
            assert r.status == status
            error = (await r.json())["error"]
        assert error["message"] and error["type"]
    reply = await client(proxy).responses.create(model="gpt", input="still here?")
    assert reply.output_text


async def test_a_websocket_probe_is_told_to_use_http_at_once(proxy: TestServer) -> None:
    """Codex with supports_websockets tries GET /v1/responses with an upgrade first: 426 makes
    it fall back to HTTP without retrying."""
    headers = {"Connection": "Upgrade", "Upgrade": "websocket", "Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(str(proxy.make_url("/v1/responses")), headers=headers) as r:
            assert r.status == 426
            error = (await r.json())["error"]
    assert error["code"] == "websocket_not_supported" and "POST /v1/responses" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_degraded_answer_is_a_response_the_client_reads(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, sim: Simulator, stream: bool
) -> None:
    from proxy.sim.simulator import Fault

    policy = "policies:\n  - name: calm\n    degraded: true\n    retry: {attempts: 1}\n"
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), policies=policy)
    sim.inject(Fault(status=503))
    sdk = client(proxy)
    if stream:
        async with sdk.responses.stream(model="gpt", input="hi") as events:
            reply = await events.get_final_response()
    else:
        reply = await sdk.responses.create(model="gpt", input="hi")
    assert reply.output_text.startswith("[agentproxy] The model is unavailable right now")
