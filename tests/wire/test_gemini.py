"""The Gemini wire through the real proxy with the real `google-genai` SDK, over real sockets:
to a chat deployment (the simulator's OpenAI twin: translated both ways) and natively to a
`gemini/` deployment (the simulator's Gemini twin): plain, streamed, function calling,
countTokens, the model list, errors in Google's shape, the key never logged."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory

KEY = "sk-proxy-gemini-1"
OTHER = "sk-proxy-gemini-2"
UPSTREAM_KEY = "sk-sim-upstream-secret"
READ_FILE = types.FunctionDeclaration(
    name="read_file",
    description="Read a file",
    parameters_json_schema={
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
)
TOOLS = [types.Tool(function_declarations=[READ_FILE])]
NO_AUTO = types.AutomaticFunctionCallingConfig(disable=True)


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
          api_keys: [{{name: agent, key: {KEY}}}, {{name: other, key: {OTHER}}}]
        model_list:
          - model_name: chat-model
            litellm_params:
              model: openai/sim
              api_base: {url}/v1
              api_key: {UPSTREAM_KEY}
            model_info:
              max_input_tokens: {window}
          - model_name: gemini-native
            litellm_params:
              model: gemini/gemini-sim
              api_base: {url}
              api_key: {UPSTREAM_KEY}
            model_info:
              max_input_tokens: {window}
        """
    path = tmp_path / "gemini.yaml"
    path.write_text(textwrap.dedent(text) + textwrap.dedent(policies))
    return await start_proxy(path)


def client(proxy: TestServer, key: str = KEY, version: str | None = None) -> genai.Client:
    options: dict[str, Any] = {"base_url": str(proxy.make_url("")).rstrip("/")}
    if version is not None:
        options["api_version"] = version
    return genai.Client(api_key=key, http_options=types.HttpOptions(**options))


@pytest.fixture
def sim() -> Simulator:
    return Simulator(context_window=8192, api_key=UPSTREAM_KEY)


@pytest.fixture
async def upstream(aiohttp_server: Any, sim: Simulator) -> TestServer:
    server: TestServer = await aiohttp_server(sim.app())
    return server


@pytest.mark.parametrize("model", ["chat-model", "gemini-native"])
@pytest.mark.parametrize("version", [None, "v1beta"])
async def test_plain_and_streamed(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    sim: Simulator,
    model: str,
    version: str | None,
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream)
    sdk = client(proxy, version=version)
    reply = await sdk.aio.models.generate_content(
        model=model,
        contents="hello there",
        config=types.GenerateContentConfig(system_instruction="be brief"),
    )
    assert reply.text == "You said: hello there"
    assert reply.usage_metadata is not None and reply.usage_metadata.prompt_token_count
    pieces = [
        chunk.text or ""
        async for chunk in await sdk.aio.models.generate_content_stream(
            model=model, contents="stream me please"
        )
    ]
    assert "".join(pieces) == "You said: stream me please"
    sent = sim.requests[-1]
    if model == "gemini-native":  # Google's own wire, model in the URL, key in its header
        assert sent.path == "/v1beta/models/gemini-sim:streamGenerateContent"
        assert sent.headers["x-goog-api-key"] == UPSTREAM_KEY
        assert "model" not in sent.body
        assert sim.requests[-2].body["systemInstruction"]["parts"] == [{"text": "be brief"}]
    else:
        assert sent.path == "/v1/chat/completions"
        assert sim.requests[-2].body["messages"][0] == {"role": "system", "content": "be brief"}


@pytest.mark.parametrize("model", ["chat-model", "gemini-native"])
@pytest.mark.parametrize("streamed", [False, True])
async def test_function_calling_round_trip(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    sim: Simulator,
    model: str,
    streamed: bool,
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream)
    sdk = client(proxy)
    config = types.GenerateContentConfig(tools=TOOLS, automatic_function_calling=NO_AUTO)
    ask = types.Content(role="user", parts=[types.Part(text='read_file({"path": "notes.txt"})')])
    if streamed:
        chunks = [
            c
            async for c in await sdk.aio.models.generate_content_stream(
                model=model, contents=[ask], config=config
            )
        ]
        calls = [p for c in chunks for p in (c.candidates[0].content.parts or ())]  # type: ignore[index, union-attr]
        turn = types.Content(role="model", parts=calls)
    else:
        reply = await sdk.aio.models.generate_content(model=model, contents=[ask], config=config)
        turn = reply.candidates[0].content  # type: ignore[index, assignment]
    call = next(p.function_call for p in turn.parts or () if p.function_call)  # type: ignore[union-attr]
    assert call.name == "read_file" and call.args == {"path": "notes.txt"}
    answer = types.Part.from_function_response(name="read_file", response={"output": "42 lines"})
    if call.id:
        answer.function_response.id = call.id  # type: ignore[union-attr]
    history = [ask, turn, types.Content(role="user", parts=[answer])]
    final = await sdk.aio.models.generate_content(model=model, contents=history, config=config)
    assert final.text == "read_file returned: 42 lines"
    if model == "gemini-native":  # the signed call part went back byte for byte
        sent = sim.requests[-1].body["contents"][1]["parts"]
        signed = [p for p in sent if "thoughtSignature" in p]
        assert signed and signed[0]["thoughtSignature"].startswith("c2lt")


async def test_count_tokens_and_models(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream)
    for version in (None, "v1beta"):
        sdk = client(proxy, version=version)
        counted = await sdk.aio.models.count_tokens(model="chat-model", contents="a" * 400)
        assert counted.total_tokens is not None and 100 <= counted.total_tokens < 130
        names = [m.name async for m in await sdk.aio.models.list()]
        assert names == ["models/chat-model", "models/gemini-native"]
        one = await sdk.aio.models.get(model="gemini-native")
        assert one.name == "models/gemini-native" and one.input_token_limit == 8192
    async with aiohttp.ClientSession() as http:  # OpenAI's list stays OpenAI's
        url = proxy.make_url("/v1/models")
        async with http.get(url, headers={"Authorization": f"Bearer {KEY}"}) as response:
            assert (await response.json())["object"] == "list"


async def test_errors_in_googles_shape_and_key_never_logged(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream)
    with pytest.raises(genai_errors.ClientError) as refused:
        await client(proxy, key="wrong").aio.models.generate_content(
            model="chat-model", contents="hi"
        )
    assert refused.value.code == 401 and refused.value.status == "UNAUTHENTICATED"
    with pytest.raises(genai_errors.ClientError) as unknown:
        await client(proxy).aio.models.generate_content(model="nope", contents="hi")
    assert unknown.value.code == 404 and unknown.value.status == "NOT_FOUND"
    caplog.set_level(logging.INFO)
    async with aiohttp.ClientSession() as http:  # the key in the query, as curl users send it
        url = proxy.make_url("/v1beta/models/chat-model:generateContent").with_query(key=KEY)
        body = {"contents": []}
        async with http.post(url, json=body) as response:
            assert response.status == 400
            error = (await response.json())["error"]
            assert error["status"] == "INVALID_ARGUMENT" and "contents" in error["message"]
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        async with http.post(url, json=body) as response:
            assert response.status == 200
            assert (await response.json())["candidates"][0]["content"]["parts"]
    assert KEY not in caplog.text and "/v1beta/models/chat-model:generateContent" in caplog.text


async def test_upstream_error_passes_in_googles_shape(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, sim: Simulator
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream, policies="")
    from proxy.sim.simulator import Fault

    sim.inject(Fault(status=400, times=1))
    async with aiohttp.ClientSession() as http:
        url = proxy.make_url("/v1beta/models/gemini-native:generateContent")
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        async with http.post(url, json=body, headers={"x-goog-api-key": KEY}) as response:
            assert response.status == 400
            error = orjson.loads(await response.read())["error"]
            assert error["status"] == "INVALID_ARGUMENT" and error["code"] == 400
