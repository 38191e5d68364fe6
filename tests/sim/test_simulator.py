"""The simulated upstream: scripted answers, OpenAI/Anthropic wire formats, errors and faults.

Wire-format claims are checked with the real clients (openai SDK, litellm) over real sockets.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp.test_utils import TestClient

from proxy.pipeline.compaction.summarizer import Fit, render_transcript, summary_request
from proxy.policies.spec import Deployment
from proxy.sim import Fault, Simulator, run_simulator, serve_simulator
from proxy.sim.chat import MISSING_TOOL_RESULTS, NO_KEY, ORPHAN_TOOL
from proxy.sim.model import estimate_prompt_tokens, summary_sections

JSON = dict[str, Any]
CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"


def tool(name: str, properties: JSON, required: list[str]) -> JSON:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


TOOLS = [
    tool("read_file", {"path": {"type": "string"}}, ["path"]),
    tool(
        "search",
        {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "mode": {"type": "string", "enum": ["fast", "deep"]},
            "exact": {"type": "boolean"},
            "filters": {
                "type": "object",
                "properties": {"lang": {"type": ["string", "null"]}},
                "required": ["lang"],
            },
            "page": {"type": "integer"},
        },
        ["query", "limit", "mode", "exact", "filters"],
    ),
    tool("read_file_lines", {"path": {"type": "string"}, "start": {"type": "number"}}, ["path"]),
]


def user(text: str) -> JSON:
    return {"role": "user", "content": text}


def chat(*messages: JSON, **extra: Any) -> JSON:
    return {"model": "sim", "messages": list(messages), **extra}


def assistant_calls(*ids_and_names: tuple[str, str]) -> JSON:
    calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}}
        for i, n in ids_and_names
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def tool_result(call_id: str, content: str) -> JSON:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def sse_payloads(text: str) -> list[str]:
    return [block[len("data: ") :] for block in text.split("\n\n") if block.startswith("data: ")]


def without_ids(response: JSON) -> JSON:
    return {k: v for k, v in response.items() if k not in ("id", "created")}


@pytest.fixture
def sim() -> Simulator:
    return Simulator()


@pytest.fixture
async def client(aiohttp_client: Any, sim: Simulator) -> TestClient[Any, Any]:
    test_client: TestClient[Any, Any] = await aiohttp_client(sim.app())
    return test_client


@pytest.fixture
async def root_url(sim: Simulator) -> AsyncIterator[str]:
    async with run_simulator(sim) as url:
        yield url


@pytest.fixture
async def oai(root_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{root_url}/v1", api_key="sk-test", max_retries=0
    ) as sdk:
        yield sdk


async def post(client: TestClient[Any, Any], body: Any, path: str = CHAT, **kw: Any) -> Any:
    payload = {"data": body} if isinstance(body, bytes) else {"json": body}
    async with client.post(path, **payload, **kw) as response:
        assert response.content_type == "application/json"
        return response.status, await response.json()


# --- scripted behaviour -----------------------------------------------------------------------


async def test_text_answer_echoes_the_last_user_message(client: TestClient[Any, Any]) -> None:
    body = chat({"role": "system", "content": "be brief"}, user("x" * 300), model="gpt-sim")
    async with client.post(CHAT, json=body) as response:
        reply = await response.json()
        headers = response.headers
    assert reply["object"] == "chat.completion"
    assert reply["id"] == "chatcmpl-sim00000001"
    assert reply["model"] == "gpt-sim"
    assert reply["system_fingerprint"].startswith("fp_")
    choice = reply["choices"][0]
    assert choice["message"]["content"] == "You said: " + "x" * 200
    assert choice["finish_reason"] == "stop"
    # 308 chars -> 77 tokens, + 4 per message; the answer is 210 chars -> 53 tokens.
    assert reply["usage"]["prompt_tokens"] == 77 + 8
    assert reply["usage"]["completion_tokens"] == 53
    assert reply["usage"]["total_tokens"] == 85 + 53
    assert headers["x-request-id"] == "req_sim00000001"
    assert int(headers["openai-processing-ms"]) >= 0
    assert headers["x-ratelimit-remaining-requests"] == "9999"


async def test_naming_a_tool_calls_it_with_placeholder_arguments(
    client: TestClient[Any, Any],
) -> None:
    _, reply = await post(client, chat(user("please search the docs"), tools=TOOLS))
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and re.fullmatch(r"call_[0-9a-f]{24}", call["id"])
    assert call["function"]["name"] == "search"
    assert orjson.loads(call["function"]["arguments"]) == {
        "query": "example",
        "limit": 1,
        "mode": "fast",
        "exact": True,
        "filters": {"lang": "example"},
    }


async def test_longest_tool_name_wins(client: TestClient[Any, Any]) -> None:
    _, reply = await post(client, chat(user("use read_file_lines"), tools=TOOLS))
    assert reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read_file_lines"


async def test_json_arguments_in_the_text_become_parallel_calls(
    client: TestClient[Any, Any],
) -> None:
    text = 'first read_file({"path": "a.py"}) then search({"query": "x", "limit": 3}) please'
    _, reply = await post(client, chat(user(text), tools=TOOLS))
    calls = reply["choices"][0]["message"]["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("read_file", '{"path":"a.py"}'),
        ("search", '{"query":"x","limit":3}'),
    ]
    assert calls[0]["id"] != calls[1]["id"]


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        ({"tool_choice": "none"}, []),
        ({"tool_choice": "required"}, ["read_file"]),
        ({"tool_choice": {"type": "function", "function": {"name": "search"}}}, ["search"]),
        ({"parallel_tool_calls": False}, ["read_file"]),
    ],
)
async def test_tool_choice_is_honoured(
    client: TestClient[Any, Any], extra: JSON, names: list[str]
) -> None:
    text = "hello" if "tool_choice" in extra else 'read_file({"path":"a"}) read_file({"path":"b"})'
    _, reply = await post(client, chat(user(text), tools=TOOLS, **extra))
    calls = reply["choices"][0]["message"].get("tool_calls") or []
    assert [c["function"]["name"] for c in calls] == names


async def test_tool_results_get_a_final_answer_quoting_them(client: TestClient[Any, Any]) -> None:
    body = chat(
        user("read both"),
        assistant_calls(("call_1", "read_file"), ("call_2", "search")),
        tool_result("call_1", "A" * 250),
        tool_result("call_2", "no hits"),
        tools=TOOLS,
    )
    _, reply = await post(client, body)
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["choices"][0]["message"]["content"] == (
        f"read_file returned: {'A' * 200}\nsearch returned: no hits"
    )


async def test_max_tokens_cuts_the_answer_with_finish_reason_length(
    client: TestClient[Any, Any],
) -> None:
    _, reply = await post(client, chat(user("one two three four five six"), max_tokens=3))
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["choices"][0]["message"]["content"] == "You said: on"  # 3 tokens = 12 chars
    assert reply["usage"]["completion_tokens"] == 3


async def test_responder_overrides_the_script(aiohttp_client: Any) -> None:
    seen: list[JSON] = []

    async def responder(body: JSON) -> JSON:
        seen.append(body)
        return {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}

    client = await aiohttp_client(Simulator(responder=responder).app())
    _, reply = await post(client, chat(user("hi")))
    [call] = reply["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "f", "arguments": "{}"} and call["id"].startswith("call_")
    assert reply["choices"][0]["finish_reason"] == "tool_calls"
    assert seen[0]["messages"] == [user("hi")]


async def test_same_request_same_answer_except_id_and_created(aiohttp_client: Any) -> None:
    body = chat(user("read_file please"), tools=TOOLS)
    first_client = await aiohttp_client(Simulator().app())
    _, first = await post(first_client, body)
    _, second = await post(first_client, body)
    _, other_sim = await post(await aiohttp_client(Simulator().app()), body)
    assert first["id"] != second["id"]
    assert without_ids(first) == without_ids(second) == without_ids(other_sim)
    assert first["id"] == other_sim["id"]  # ids come from a counter, not from randomness


async def test_prompt_estimate_counts_contents_calls_schemas_and_messages() -> None:
    body = chat(
        user("abcd" * 10),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "function": {"name": "abc", "arguments": "x" * 9}}],
        },
        tool_result("c", "abcd"),
        tools=TOOLS,
    )
    chars = 40 + 3 + 9 + 4 + len(orjson.dumps(TOOLS))
    assert estimate_prompt_tokens(body) == -(-chars // 4) + 3 * 4


# --- structured summaries (what the proxy's summarizer asks for) -------------------------------


def summary_body(messages: list[JSON]) -> JSON:
    target = Deployment("sim", "openai/sim", "openai", "sim", None, None)
    return summary_request(target, messages, Fit(100_000, 1_000))


async def test_a_summary_request_gets_the_four_sections(client: TestClient[Any, Any]) -> None:
    messages = [
        user("Refactor src/app/main.py so the CLI reads config.yaml"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "src/app/main.py"}'},
                }
            ],
        },
        tool_result("c1", "def main(): ..."),
        user("Also keep the old flags working"),
    ]
    status, reply = await post(client, summary_body(messages))
    assert status == 200
    sections = summary_sections(reply["choices"][0]["message"]["content"])
    assert list(sections) == ["SESSION INTENT", "SUMMARY", "ARTIFACTS", "NEXT STEPS"]
    assert sections["SESSION INTENT"] == "Refactor src/app/main.py so the CLI reads config.yaml"
    assert sections["NEXT STEPS"] == "Also keep the old flags working"
    assert sections["ARTIFACTS"].splitlines() == ["- src/app/main.py", "- config.yaml"]
    assert "1 tool results" in sections["SUMMARY"] and "read_file" in sections["SUMMARY"]


async def test_a_summary_of_a_summary_carries_the_intent_forward(
    client: TestClient[Any, Any],
) -> None:
    earlier = (
        "[agentproxy] Earlier conversation summarized (9 messages archived as "
        "ap_0123456789abcdef01234567; call agentproxy_recall with that ref to read them).\n\n"
        "SESSION INTENT:\nShip the parser\n\nSUMMARY:\n...\n\nARTIFACTS:\n- parser.py\n\n"
        "NEXT STEPS:\nwrite tests"
    )
    _, reply = await post(client, summary_body([user(earlier), user("now add docs")]))
    sections = summary_sections(reply["choices"][0]["message"]["content"])
    assert sections["SESSION INTENT"] == "Ship the parser"
    assert sections["NEXT STEPS"] == "now add docs"
    assert "- ap_0123456789abcdef01234567" in sections["ARTIFACTS"].splitlines()


def test_text_without_sections_has_none() -> None:
    assert summary_sections("no headings here") == {}


async def test_an_empty_transcript_still_gets_the_sections(client: TestClient[Any, Any]) -> None:
    _, reply = await post(client, summary_body([]))
    sections = summary_sections(reply["choices"][0]["message"]["content"])
    assert list(sections) == ["SESSION INTENT", "SUMMARY", "ARTIFACTS", "NEXT STEPS"]
    assert sections["ARTIFACTS"] == "- none"


async def test_ordinary_requests_are_not_summaries(client: TestClient[Any, Any]) -> None:
    transcript = render_transcript([user("SESSION INTENT: NEXT STEPS:")], 1_000, 10_000)
    _, reply = await post(client, chat(user(transcript)))
    assert reply["choices"][0]["message"]["content"].startswith("You said: ")


# --- streaming --------------------------------------------------------------------------------


async def test_stream_through_the_openai_sdk(oai: openai.AsyncOpenAI, sim: Simulator) -> None:
    sim.words_per_chunk = 2
    stream = await oai.chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "the quick brown fox jumps"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [
        c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content
    ]
    assert pieces == ["You said: ", "the quick ", "brown fox ", "jumps"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + 9


async def test_tool_call_stream_reassembled_by_the_sdk(oai: openai.AsyncOpenAI) -> None:
    request: Any = {
        "model": "sim",
        "messages": [{"role": "user", "content": 'read_file({"path": "a"}) and search'}],
        "tools": TOOLS,
    }
    async with oai.chat.completions.stream(**request) as stream:
        streamed = await stream.get_final_completion()
    plain = await oai.chat.completions.create(**request)
    assert streamed.choices[0].finish_reason == "tool_calls"
    calls = streamed.choices[0].message.tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        (c.id, c.function.name, c.function.arguments)
        for c in plain.choices[0].message.tool_calls or []
    ]
    assert [c.function.name for c in calls] == ["read_file"]


async def test_stream_without_usage_option_has_no_usage_fields(
    client: TestClient[Any, Any],
) -> None:
    async with client.post(CHAT, json=chat(user("hi"), stream=True)) as response:
        assert response.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        payloads = sse_payloads(await response.text())
    assert payloads[-1] == "[DONE]"
    assert all("usage" not in orjson.loads(p) for p in payloads[:-1])


async def test_chunks_are_paced_not_buffered(client: TestClient[Any, Any], sim: Simulator) -> None:
    sim.chunk_delay_s = 0.05
    arrivals = []
    async with client.post(CHAT, json=chat(user("a b c d e f"), stream=True)) as response:
        async for line in response.content:
            if line.startswith(b"data: "):
                arrivals.append(time.monotonic())
    # role + 8 content chunks + finish + [DONE], 50 ms apart: spread over ~0.5 s
    assert len(arrivals) == 11
    assert arrivals[-1] - arrivals[0] >= 0.4
    assert arrivals[1] - arrivals[0] >= 0.04


# --- request checks, in OpenAI's order and words -------------------------------------------


async def test_missing_and_wrong_api_keys_are_401(
    client: TestClient[Any, Any], sim: Simulator
) -> None:
    sim.api_key = "sk-right-key-0000"
    status, missing = await post(client, chat(user("x")))
    assert status == 401
    assert missing == {
        "error": {"message": NO_KEY, "type": "invalid_request_error", "param": None, "code": None}
    }
    wrong = "sk-wrong-key-123456789WXYZ"
    status, body = await post(client, b"not json", headers={"Authorization": f"Bearer {wrong}"})
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key"
    masked = "sk-" + "*" * (len(wrong) - 7) + "WXYZ"
    assert body["error"]["message"] == (
        f"Incorrect API key provided: {masked}. "
        "You can find your API key at https://platform.openai.com/account/api-keys."
    )
    status, _ = await post(
        client, chat(user("x")), headers={"Authorization": "Bearer sk-right-key-0000"}
    )
    assert status == 200


async def test_sdk_sees_authentication_error(oai: openai.AsyncOpenAI, sim: Simulator) -> None:
    sim.api_key = "sk-other"
    with pytest.raises(openai.AuthenticationError) as caught:
        await oai.chat.completions.create(model="sim", messages=[{"role": "user", "content": "x"}])
    assert caught.value.code == "invalid_api_key"


@pytest.mark.parametrize(
    ("body", "param", "code", "message"),
    [
        ({"model": "sim"}, "messages", "missing_required_parameter", "Missing required parameter"),
        (chat(), "messages", "empty_array", "Invalid 'messages': empty array."),
        ({"model": "sim", "messages": "hi"}, "messages", "invalid_type", "Invalid type"),
        (chat(user("x"), {"role": "robot"}), "messages[1].role", "invalid_value", "Invalid value"),
    ],
)
async def test_bad_messages_are_400(
    client: TestClient[Any, Any], body: JSON, param: str, code: str, message: str
) -> None:
    status, error = await post(client, body)
    assert status == 400
    assert (error["error"]["param"], error["error"]["code"]) == (param, code)
    assert error["error"]["message"].startswith(message)
    assert error["error"]["type"] == "invalid_request_error"


async def test_invalid_json_is_400(client: TestClient[Any, Any]) -> None:
    status, error = await post(client, b"{nope")
    assert status == 400
    assert error["error"]["message"].startswith("We could not parse the JSON body of your request.")


async def test_tool_calls_without_results_are_400(client: TestClient[Any, Any]) -> None:
    body = chat(
        user("go"),
        assistant_calls(("call_a", "read_file"), ("call_b", "read_file")),
        tool_result("call_a", "ok"),
        user("next"),
    )
    status, error = await post(client, body)
    assert status == 400
    assert error["error"] == {
        "message": MISSING_TOOL_RESULTS + "call_b",
        "type": "invalid_request_error",
        "param": "messages.[3].role",
        "code": None,
    }


async def test_orphan_tool_message_is_400(client: TestClient[Any, Any]) -> None:
    status, error = await post(client, chat(user("go"), tool_result("call_x", "?")))
    assert status == 400
    assert error["error"]["message"] == ORPHAN_TOOL
    assert "preceeding message with 'tool_calls'" in ORPHAN_TOOL  # OpenAI's own spelling
    assert error["error"]["param"] == "messages.[1].role"


async def test_tool_message_for_an_unknown_call_is_400(client: TestClient[Any, Any]) -> None:
    body = chat(user("go"), assistant_calls(("call_a", "f")), tool_result("call_z", "?"))
    status, error = await post(client, body)
    assert status == 400
    assert error["error"]["message"] == (
        "Invalid parameter: 'tool_call_id' of 'call_z' not found in 'tool_calls' "
        "of previous message."
    )


async def test_context_window_overflow_is_400(client: TestClient[Any, Any], sim: Simulator) -> None:
    sim.context_window = 100
    status, error = await post(client, chat(user("x" * 400)))
    assert status == 400
    assert error["error"] == {
        "message": "This model's maximum context length is 100 tokens. However, your messages "
        "resulted in 104 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    fits = chat(user("x" * 184), max_tokens=50)  # 46 + 4 prompt tokens + 50 = exactly 100
    assert (await post(client, fits))[0] == 200
    status, error = await post(client, chat(user("x" * 184), max_completion_tokens=51))
    assert error["error"]["message"] == (
        "This model's maximum context length is 100 tokens. However, you requested 101 tokens "
        "(50 in the messages, 51 in the completion). Please reduce the length of the messages "
        "or completion."
    )


# --- faults -----------------------------------------------------------------------------------


async def test_status_fault_with_retry_headers(
    client: TestClient[Any, Any], sim: Simulator
) -> None:
    sim.inject(Fault(status=429, retry_after=2, retry_after_ms=1500, times=2))
    for _ in range(2):
        async with client.post(CHAT, json=chat(user("x"))) as response:
            assert response.status == 429
            assert response.headers["retry-after"] == "2"
            assert response.headers["retry-after-ms"] == "1500"
            assert response.headers["x-ratelimit-remaining-requests"] == "0"
            error = (await response.json())["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
    assert error["message"].startswith("Rate limit reached for sim in organization")
    assert (await post(client, chat(user("x"))))[0] == 200
    assert sim.faults == []


async def test_sdk_maps_fault_statuses(oai: openai.AsyncOpenAI, sim: Simulator) -> None:
    sim.inject(Fault(status=500), Fault(status=503))
    messages: Any = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.InternalServerError) as caught:
        await oai.chat.completions.create(model="sim", messages=messages)
    assert caught.value.status_code == 500
    with pytest.raises(openai.InternalServerError) as caught:
        await oai.chat.completions.create(model="sim", messages=messages)
    assert caught.value.status_code == 503


async def test_fault_body_override(client: TestClient[Any, Any], sim: Simulator) -> None:
    sim.inject(
        Fault(status=422, body={"detail": "custom"}), Fault(status=502, body="<html>bad</html>")
    )
    assert await post(client, chat(user("x"))) == (422, {"detail": "custom"})
    async with client.post(CHAT, json=chat(user("x"))) as response:
        assert (response.status, response.content_type) == (502, "text/html")
        assert await response.text() == "<html>bad</html>"


async def test_faults_match_by_model_and_skip_invalid_requests(
    client: TestClient[Any, Any], sim: Simulator
) -> None:
    sim.inject(Fault(status=500, model="big"))
    assert (await post(client, chat(user("x"))))[0] == 200  # model "sim": not matched
    assert (await post(client, chat()))[0] == 400  # invalid: checked before faults
    assert (await post(client, chat(user("x"), model="big")))[0] == 500
    assert (await post(client, chat(user("x"), model="big")))[0] == 200


async def test_delay_fault_trips_client_timeouts(
    client: TestClient[Any, Any], sim: Simulator
) -> None:
    sim.inject(Fault(delay_s=0.2), Fault(delay_s=30))
    started = time.monotonic()
    assert (await post(client, chat(user("x"))))[0] == 200
    assert time.monotonic() - started >= 0.2
    with pytest.raises(asyncio.TimeoutError):
        await post(client, chat(user("x")), timeout=aiohttp.ClientTimeout(total=0.2))
    # Teardown must not wait out the remaining 30 s delay.


async def test_reset_fault_drops_the_connection(
    client: TestClient[Any, Any], sim: Simulator
) -> None:
    sim.inject(Fault(reset=True))
    with pytest.raises((aiohttp.ClientOSError, aiohttp.ServerDisconnectedError)):
        await post(client, chat(user("x")))
    assert (await post(client, chat(user("x"))))[0] == 200


async def test_malformed_fault_non_stream(client: TestClient[Any, Any], sim: Simulator) -> None:
    sim.inject(Fault(malformed=True))
    async with client.post(CHAT, json=chat(user("x"))) as response:
        assert response.status == 200
        raw = await response.read()
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)


async def test_malformed_fault_stream(client: TestClient[Any, Any], sim: Simulator) -> None:
    sim.inject(Fault(malformed=True))
    async with client.post(CHAT, json=chat(user("a b"), stream=True)) as response:
        payloads = sse_payloads(await response.text())
    broken = []
    for payload in payloads[:-1]:
        try:
            orjson.loads(payload)
        except orjson.JSONDecodeError:
            broken.append(payload)
    assert len(broken) == 1 and payloads[-1] == "[DONE]"


async def test_cut_fault_sends_n_chunks_then_drops(
    client: TestClient[Any, Any], sim: Simulator
) -> None:
    sim.inject(Fault(cut_after_chunks=2))
    lines = []
    async with client.post(CHAT, json=chat(user("a b c d e f"), stream=True)) as response:
        with pytest.raises(aiohttp.ClientPayloadError):
            async for line in response.content:
                lines.append(line)
    payloads = [orjson.loads(line[6:]) for line in lines if line.startswith(b"data: ")]
    contents = [p["choices"][0]["delta"].get("content") for p in payloads[1:]]
    assert contents == ["You ", "said: "]


async def test_cut_fault_through_the_sdk(oai: openai.AsyncOpenAI, sim: Simulator) -> None:
    sim.inject(Fault(cut_after_chunks=1))
    stream = await oai.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "a b c"}], stream=True
    )
    received = []
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            received.append(chunk)
    assert len(received) == 2  # the role chunk and one content chunk


# --- model list and control API ----------------------------------------------------------------


async def test_models_lists_sim_and_every_model_seen(client: TestClient[Any, Any]) -> None:
    await post(client, chat(user("x"), model="gpt-x"))
    await post(client, {"model": "claude-y", "max_tokens": 5, "messages": [user("x")]}, MESSAGES)
    async with client.get("/v1/models") as response:
        listing = await response.json()
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == ["sim", "gpt-x", "claude-y"]


async def test_control_api_scripts_a_running_simulator(client: TestClient[Any, Any]) -> None:
    async with client.post("/sim/faults", json=[{"status": 503}, {"status": 429, "times": 2}]) as r:
        assert await r.json() == {"queued": 2}
    statuses = [(await post(client, chat(user(str(i)))))[0] for i in range(4)]
    assert statuses == [503, 429, 429, 200]
    async with client.get("/sim/requests") as r:
        recorded = await r.json()
    assert len(recorded) == 4
    assert recorded[3]["body"]["messages"] == [user("3")] and recorded[3]["path"] == CHAT
    assert recorded[3]["headers"]["content-type"] == "application/json"
    async with client.post("/sim/faults", json=[{"status": 500}]) as r:
        pass
    async with client.delete("/sim/requests") as r:
        assert r.status == 200
    async with client.get("/sim/requests") as r:
        assert await r.json() == []
    assert (await post(client, chat(user("x"))))[0] == 200  # the fault went too
    async with client.post("/sim/faults", json=[{"bogus": 1}]) as r:
        assert r.status == 400


async def test_recorded_headers_ignore_case(client: TestClient[Any, Any], sim: Simulator) -> None:
    await post(client, chat(user("x")), headers={"Authorization": "Bearer k"})
    headers = sim.requests[-1].headers
    assert headers["Authorization"] == headers["authorization"] == "Bearer k"
    assert "AUTHORIZATION" in headers


async def test_record_false_only_counts(aiohttp_client: Any) -> None:
    sim = Simulator(record=False)
    client = await aiohttp_client(sim.app())
    _, reply = await post(client, chat(user("x")))
    assert (sim.requests, sim.request_count) == ([], 1)
    assert reply["id"] == "chatcmpl-sim00000001"


async def test_missing_model_is_400(client: TestClient[Any, Any]) -> None:
    status, error = await post(client, {"messages": [user("x")]})
    assert (status, error["error"]["message"]) == (400, "you must provide a model parameter")


async def test_serve_simulator_prints_its_address(
    sim: Simulator, capsys: pytest.CaptureFixture[str]
) -> None:
    task = asyncio.create_task(serve_simulator("127.0.0.1", 0, sim))
    for _ in range(100):
        if out := capsys.readouterr().out:
            break
        await asyncio.sleep(0.02)
    match = re.fullmatch(r"simulated upstream on (http://127\.0\.0\.1:\d+/v1)\n", out)
    assert match, out
    async with aiohttp.ClientSession() as http, http.get(match.group(1) + "/models") as r:
        assert r.status == 200
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --- Anthropic Messages twin -------------------------------------------------------------------


def anthropic(*messages: JSON, **extra: Any) -> JSON:
    return {"model": "claude-sim", "max_tokens": 100, "messages": list(messages), **extra}


ANTHROPIC_TOOLS = [
    {"name": "read_file", "input_schema": TOOLS[0]["function"]["parameters"]},
]


async def test_anthropic_text_and_tool_use(client: TestClient[Any, Any]) -> None:
    status, reply = await post(client, anthropic(user("hello")), MESSAGES)
    assert status == 200
    assert reply["type"] == "message" and reply["id"] == "msg_sim00000001"
    assert reply["content"] == [{"type": "text", "text": "You said: hello"}]
    assert reply["stop_reason"] == "end_turn"
    assert reply["usage"]["input_tokens"] == 2 + 4 and reply["usage"]["output_tokens"] == 4
    _, reply = await post(client, anthropic(user("read_file now"), tools=ANTHROPIC_TOOLS), MESSAGES)
    [block] = reply["content"]
    assert block["type"] == "tool_use" and block["id"].startswith("toolu_")
    assert (block["name"], block["input"]) == ("read_file", {"path": "example"})
    assert reply["stop_reason"] == "tool_use"


async def test_anthropic_tool_result_is_quoted(client: TestClient[Any, Any]) -> None:
    body = anthropic(
        user("read"),
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "data"}],
        },
    )
    _, reply = await post(client, body, MESSAGES)
    assert reply["content"][0]["text"] == "read_file returned: data"


async def test_anthropic_stream_event_sequence(client: TestClient[Any, Any]) -> None:
    body = anthropic(user('read_file({"path": "p"})'), tools=ANTHROPIC_TOOLS, stream=True)
    async with client.post(MESSAGES, json=body) as response:
        text = await response.text()
    names = re.findall(r"^event: (\w+)$", text, flags=re.M)
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-4:] == [
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    data = [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    partial = "".join(
        d["delta"]["partial_json"] for d in data if d["type"] == "content_block_delta"
    )
    assert orjson.loads(partial) == {"path": "p"}
    assert data[-2]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    ("body", "headers", "status", "kind", "message"),
    [
        (anthropic(user("x")), {}, 401, "authentication_error", "x-api-key header is required"),
        (
            anthropic(user("x")),
            {"x-api-key": "bad"},
            401,
            "authentication_error",
            "invalid x-api-key",
        ),
        (
            {"model": "c", "messages": [user("x")]},
            {"x-api-key": "k"},
            400,
            "invalid_request_error",
            "max_tokens: Field required",
        ),
        (
            anthropic(
                user("x"),
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_9", "name": "f", "input": {}}],
                },
                user("y"),
            ),
            {"x-api-key": "k"},
            400,
            "invalid_request_error",
            "messages.1: `tool_use` ids were found without `tool_result` blocks "
            "immediately after: toolu_9.",
        ),
        (
            anthropic(user("x" * 40000)),
            {"x-api-key": "k"},
            400,
            "invalid_request_error",
            "prompt is too long: 10004 tokens > 8192 maximum",
        ),
    ],
)
async def test_anthropic_errors(
    client: TestClient[Any, Any],
    sim: Simulator,
    body: JSON,
    headers: dict[str, str],
    status: int,
    kind: str,
    message: str,
) -> None:
    sim.api_key = "k"
    got_status, error = await post(client, body, MESSAGES, headers=headers)
    assert got_status == status
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert error["error"]["message"].startswith(message)
    assert error["request_id"].startswith("req_")


async def test_anthropic_fault_shape(client: TestClient[Any, Any], sim: Simulator) -> None:
    sim.inject(Fault(status=529))
    status, error = await post(client, anthropic(user("x")), MESSAGES)
    assert status == 529
    assert error["error"] == {"type": "overloaded_error", "message": "Overloaded"}


# --- Anthropic twin through litellm -------------------------------------------------------------


@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no cost-map download at import
    import litellm as module

    module.suppress_debug_info = True
    module.telemetry = False
    return module


async def test_litellm_anthropic_non_stream(
    litellm: ModuleType, root_url: str, sim: Simulator
) -> None:
    sim.api_key = "x"
    reply = await litellm.acompletion(
        model="anthropic/claude-sim", api_base=root_url, api_key="x", messages=[user("hello")]
    )
    assert reply.choices[0].message.content == "You said: hello"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens == 6
    assert sim.requests[-1].path == MESSAGES and sim.requests[-1].headers["x-api-key"] == "x"


async def test_litellm_anthropic_stream(litellm: ModuleType, root_url: str) -> None:
    stream = await litellm.acompletion(
        model="anthropic/claude-sim",
        api_base=root_url,
        api_key="x",
        messages=[user("one two three")],
        stream=True,
    )
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    assert text == "You said: one two three"


async def test_litellm_anthropic_tool_round_trip(litellm: ModuleType, root_url: str) -> None:
    messages: list[Any] = [user('read_file({"path": "notes.txt"})')]
    first = await litellm.acompletion(
        model="anthropic/claude-sim",
        api_base=root_url,
        api_key="x",
        messages=messages,
        tools=TOOLS,
        stream=True,
    )
    name, arguments, call_id = "", "", ""
    async for chunk in first:
        for call in chunk.choices[0].delta.tool_calls or []:
            call_id = call.id or call_id
            name += call.function.name or ""
            arguments += call.function.arguments or ""
    assert (name, orjson.loads(arguments)) == ("read_file", {"path": "notes.txt"})
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ],
        }
    )
    messages.append(tool_result(call_id, "hello from notes"))
    final = await litellm.acompletion(
        model="anthropic/claude-sim", api_base=root_url, api_key="x", messages=messages, tools=TOOLS
    )
    assert final.choices[0].message.content == "read_file returned: hello from notes"
