"""POST /v1/chat/completions for an `openai/` deployment that serves only /v1/responses (OpenAI's
codex and pro models, a Codex-style server): the upstream's own answer on the chat route (a
404 that is not OpenAI's, or OpenAI's "only supported in v1/responses") teaches the proxy to
send the chat client's request as Responses, at once and from then on, and to answer in chat.
OpenAI's 404 for an unknown model stays a 404; another deployment is not affected.
Real sockets: the openai SDK, the proxy, the simulator behind tests/support/sim_routes.py."""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from proxy.upstream.missing_routes import lacks_route
from tests.conftest import ProxyFactory
from tests.support.sim_routes import REFUSED, serving_only

KEY = "sk-proxy-chat-as-responses"
RESPONSES_ONLY = {
    "error": {
        "message": "This model is only supported in v1/responses and not in v1/chat/completions.",
        "type": "invalid_request_error",
        "param": "model",
        "code": None,
    }
}
MODEL_NOT_FOUND = {
    "error": {
        "message": "The model `gpt-x` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": None,
        "code": "model_not_found",
    }
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
OPENED: list[Any] = []


@pytest.fixture(autouse=True)
async def close_all() -> AsyncIterator[None]:
    yield
    while OPENED:
        await OPENED.pop().close()


async def served(app: web.Application) -> str:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    OPENED.append(server)
    return str(server.make_url("")).rstrip("/")


async def proxy_sdk(start_proxy: ProxyFactory, tmp_path: Path, **urls: str) -> openai.AsyncOpenAI:
    models = "".join(
        f"""
  - model_name: {alias}
    litellm_params: {{model: openai/{alias}, api_base: "{url}/v1", api_key: sk-up}}"""
        for alias, url in urls.items()
    )
    path = tmp_path / "agentproxy.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            store: {{path: {tmp_path / "state"}}}
            keys:
              api_keys: [{{name: agent, key: {KEY}}}]
            """
        )
        + f"model_list:{models}\n"
    )
    proxy = await start_proxy(path)
    sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key=KEY, max_retries=0)
    OPENED.append(sdk)
    return sdk


def paths(sim: Simulator) -> list[str]:
    return [r.path for r in sim.requests]


async def test_a_responses_only_server_answers_chat_clients(
    start_proxy: ProxyFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sim = Simulator()
    app = serving_only(sim, "/v1/responses")
    sdk = await proxy_sdk(start_proxy, tmp_path, codex=await served(app))
    raw = await sdk.chat.completions.with_raw_response.create(
        model="codex", messages=[{"role": "user", "content": "hello there"}]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "You said: hello there"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    assert "compat.chat_as_responses" in raw.headers.get("x-agentproxy-applied", "")
    assert app[REFUSED] == ["/v1/chat/completions"]
    # Learnt: the next one goes straight to /v1/responses, streamed, with the usage asked for.
    stream = await sdk.chat.completions.create(
        model="codex",
        messages=[{"role": "user", "content": "stream me"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "You said: stream me"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert app[REFUSED] == ["/v1/chat/completions"]
    said = [r for r in caplog.records if "serves no /v1/chat/completions" in r.getMessage()]
    assert len(said) == 1 and "'codex'" in said[0].getMessage()


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_calls_round_trip_as_responses(
    start_proxy: ProxyFactory, tmp_path: Path, stream: bool
) -> None:
    sim = Simulator()
    app = serving_only(sim, "/v1/responses")
    sdk = await proxy_sdk(start_proxy, tmp_path, codex=await served(app))
    messages: list[Any] = [{"role": "user", "content": "please read_file the readme"}]
    if stream:
        # The first request teaches it as a stream too: nothing reached the client yet.
        chunks = [
            c
            async for c in await sdk.chat.completions.create(
                model="codex", messages=messages, tools=TOOLS, stream=True
            )
        ]
        calls: dict[int, dict[str, str]] = {}
        for chunk in chunks:
            for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        assert chunks[-1].usage is None  # not asked for
        (call,) = calls.values()
        call_id, name, arguments = call["id"], call["name"], call["arguments"]
    else:
        completion = await sdk.chat.completions.create(
            model="codex", messages=messages, tools=TOOLS
        )
        assert completion.choices[0].finish_reason == "tool_calls"
        (made,) = completion.choices[0].message.tool_calls or []
        assert made.type == "function"
        call_id, name, arguments = made.id, made.function.name, made.function.arguments
    assert name == "read_file" and "path" in json.loads(arguments)
    messages += [
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
        },
        {"role": "tool", "tool_call_id": call_id, "content": "README: ship it"},
    ]
    answer = await sdk.chat.completions.create(model="codex", messages=messages, tools=TOOLS)
    assert "README: ship it" in (answer.choices[0].message.content or "")
    sent = sim.requests[-1].body
    kinds = [item.get("type") for item in sent["input"]]
    assert kinds[-2:] == ["function_call", "function_call_output"]
    assert sent["tools"][0]["name"] == "read_file"  # Responses' flat tool shape
    assert app[REFUSED] == ["/v1/chat/completions"]


PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"
APPLY_PATCH: Any = {
    "type": "custom",
    "custom": {"name": "apply_patch", "description": "Edit files with a patch."},
}


@pytest.mark.parametrize("stream", [False, True])
async def test_custom_tool_calls_round_trip_as_responses_custom_calls(
    start_proxy: ProxyFactory, tmp_path: Path, stream: bool
) -> None:
    """Chat's custom tools (free-text `custom.input`) go as Responses' custom tools, their
    calls and results as custom tool calls and outputs, and a custom call the model makes
    comes back as chat's custom call."""
    sim = Simulator()
    app = serving_only(sim, "/v1/responses")
    sdk = await proxy_sdk(start_proxy, tmp_path, codex=await served(app))
    old = {"id": "call_p", "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}
    messages: list[Any] = [
        {"role": "user", "content": "add hello.txt"},
        {"role": "assistant", "content": None, "tool_calls": [old]},
        {"role": "tool", "tool_call_id": "call_p", "content": "Success."},
        {"role": "user", "content": "again: use apply_patch"},
    ]
    if stream:
        made: dict[str, str] = {"type": "", "name": "", "input": ""}
        async for chunk in await sdk.chat.completions.create(
            model="codex", messages=messages, tools=[APPLY_PATCH], stream=True
        ):
            for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                raw = delta.model_dump()
                made["type"] = raw.get("type") or made["type"]
                custom = raw.get("custom") or {}
                made["name"] += custom.get("name") or ""
                made["input"] += custom.get("input") or ""
    else:
        completion = await sdk.chat.completions.create(
            model="codex", messages=messages, tools=[APPLY_PATCH]
        )
        (call,) = completion.choices[0].message.tool_calls or []
        assert call.type == "custom"
        made = {"type": call.type, "name": call.custom.name, "input": call.custom.input}
    assert made["type"] == "custom" and made["name"] == "apply_patch" and made["input"]
    sent = sim.requests[-1].body
    assert sent["input"][1] == {
        "type": "custom_tool_call",
        "call_id": "call_p",
        "name": "apply_patch",
        "input": PATCH,
    }
    assert sent["input"][2]["type"] == "custom_tool_call_output"
    assert sent["tools"] == [{"type": "custom", **APPLY_PATCH["custom"]}]


class OpenAIResponsesOnly:
    """OpenAI's own answer for a Responses-only model on chat; /v1/responses by the simulator."""

    def __init__(self, sim: Simulator, chat_error: Any = RESPONSES_ONLY) -> None:
        self.sim = sim
        self.chat_error = chat_error
        self.chat_hits = 0

    def app(self) -> web.Application:
        app = self.sim.app()

        @web.middleware
        async def refuse_chat(
            request: web.Request, handler: web.RequestHandler
        ) -> web.StreamResponse:
            if request.path == "/v1/chat/completions":
                self.chat_hits += 1
                return web.json_response(self.chat_error, status=404)
            return await handler(request)

        app.middlewares.append(refuse_chat)
        return app


async def test_openais_responses_only_message_is_learnt(
    start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    upstream = OpenAIResponsesOnly(Simulator())
    other = Simulator()  # a second deployment, chat as ever
    sdk = await proxy_sdk(
        start_proxy,
        tmp_path,
        pro=await served(upstream.app()),
        plain=await served(other.app()),
    )
    for word in ("one", "two"):
        completion = await sdk.chat.completions.create(
            model="pro", messages=[{"role": "user", "content": word}]
        )
        assert completion.choices[0].message.content == f"You said: {word}"
    assert upstream.chat_hits == 1
    assert paths(upstream.sim) == ["/v1/responses", "/v1/responses"]
    raw = await sdk.chat.completions.with_raw_response.create(
        model="plain", messages=[{"role": "user", "content": "three"}]
    )
    assert raw.parse().choices[0].message.content == "You said: three"
    assert "chat_as_responses" not in raw.headers.get("x-agentproxy-applied", "")
    assert paths(other) == ["/v1/chat/completions"]


async def test_openai_model_not_found_is_not_learnt(
    start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    upstream = OpenAIResponsesOnly(Simulator(), chat_error=MODEL_NOT_FOUND)
    sdk = await proxy_sdk(start_proxy, tmp_path, gone=await served(upstream.app()))
    for _ in range(2):
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.chat.completions.create(
                model="gone", messages=[{"role": "user", "content": "hi"}]
            )
        assert "does not exist" in str(caught.value)
    assert upstream.chat_hits == 2
    assert paths(upstream.sim) == []


@pytest.mark.parametrize(
    ("status", "body", "lacks"),
    [
        (404, json.dumps(RESPONSES_ONLY).encode(), True),
        (400, json.dumps(RESPONSES_ONLY).encode(), True),
        (404, json.dumps(MODEL_NOT_FOUND).encode(), False),
        (500, json.dumps(RESPONSES_ONLY).encode(), False),
    ],
)
def test_openais_responses_only_message_says_chat_is_missing(
    status: int, body: bytes, lacks: bool
) -> None:
    assert lacks_route(status, body, ("only supported in v1/responses",)) is lacks


async def test_a_chat_tool_cannot_become_a_provider_tool_on_the_responses_side(
    start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """Chat has function tools only; as Responses, a tool that names a provider-side kind
    (file_search over another tenant's vector store, code_interpreter in its container) or a
    function that overrides its own type would reach objects stored in the shared provider
    account: only function tools go, built from a function's own fields."""
    sim = Simulator()
    app = serving_only(sim, "/v1/responses")
    sdk = await proxy_sdk(start_proxy, tmp_path, codex=await served(app))
    steering: list[Any] = [
        {"type": "file_search", "vector_store_ids": ["vs_someone_elses"]},
        {"type": "code_interpreter", "container": "cntr_someone_elses"},
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "parameters": {"type": "object", "properties": {}},
                "type": "file_search",
                "vector_store_ids": ["vs_someone_elses"],
            },
        },
    ]
    for _ in range(2):  # the request that teaches the route, then one sent as Responses at once
        await sdk.chat.completions.create(
            model="codex", messages=[{"role": "user", "content": "hi"}], tools=steering
        )
    sent = [r.body for r in sim.requests if r.path == "/v1/responses"]
    assert len(sent) == 2
    for body in sent:
        assert "someone_elses" not in json.dumps(body)
        assert body["tools"] == [
            {"type": "function", "name": "read_file",
             "parameters": {"type": "object", "properties": {}}}
        ]  # fmt: skip
