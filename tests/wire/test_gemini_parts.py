"""What a Gemini request may carry besides text: stored objects refused with keys configured
(Google's error shape, naming the field, the upstream hears nothing), inline images through to a
chat deployment and as sent to a native one, and Google's snake_case spelling of the REST fields
(what its own curl examples send) read as the SDKs' camelCase is."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory

from .test_gemini import KEY, OTHER, sim, start, upstream

__all__ = ["sim", "upstream"]  # fixtures
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 64).decode()
FILES_API = "https://generativelanguage.googleapis.com/v1beta/files/abc123"


async def post(
    proxy: TestServer, model: str, body: dict[str, Any], key: str = KEY, session: str = "s1"
) -> tuple[int, Any]:
    url = proxy.make_url(f"/v1beta/models/{model}:generateContent")
    headers = {"x-goog-api-key": key, "x-agentproxy-session": session}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=orjson.dumps(body), headers=headers) as answer:
            return answer.status, await answer.json(content_type=None)


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "parts": list(parts)}


STORED = [
    ({"cachedContent": "cachedContents/xyz"}, "cached_content"),
    ({"cached_content": "cachedContents/xyz"}, "cached_content"),
    (
        {"contents": [user({"text": "what is in it?"}, {"fileData": {"fileUri": FILES_API}})]},
        "contents[0].parts[1].file_data",
    ),
    (
        {"contents": [user({"file_data": {"file_uri": "files/abc123", "mime_type": "x/y"}})]},
        "contents[0].parts[0].file_data",
    ),
]


@pytest.mark.parametrize(("extra", "field"), STORED)
@pytest.mark.parametrize("model", ["chat-model", "gemini-native"])
async def test_stored_objects_are_refused_in_googles_shape(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    sim: Simulator,
    extra: dict[str, Any],
    field: str,
    model: str,
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream)
    status, answer = await post(proxy, model, {"contents": [user({"text": "hi"})], **extra})
    assert status == 400, answer
    error = answer["error"]
    assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"
    assert field in error["message"]
    [info] = error["details"]
    assert info["reason"] == "stored_object_refused" and info["metadata"]["param"] == field
    assert sim.request_count == 0


async def test_a_file_outside_the_files_api_goes_on(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, sim: Simulator
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream)
    part = {"fileData": {"fileUri": "https://example.com/paper.pdf", "mimeType": "application/pdf"}}
    status, answer = await post(proxy, "gemini-native", {"contents": [user({"text": "x"}, part)]})
    assert status == 200, answer
    assert sim.requests[-1].body["contents"][0]["parts"][1] == part


async def test_a_later_turn_is_checked_too_and_a_refused_turn_lends_nothing(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, sim: Simulator
) -> None:
    """Only the contents new on a turn are walked (the session's last view lends the rest)."""
    proxy = await start(start_proxy, tmp_path, upstream)
    contents = [user({"text": "hi"})]
    status, answer = await post(proxy, "gemini-native", {"contents": contents})
    assert status == 200, answer
    contents += [answer["candidates"][0]["content"], user({"fileData": {"fileUri": FILES_API}})]
    for _ in range(2):
        status, answer = await post(proxy, "gemini-native", {"contents": contents})
        assert status == 400 and "contents[2].parts[0].file_data" in answer["error"]["message"]
    assert sim.request_count == 1


def image_request(snake: bool) -> dict[str, Any]:
    """A request with an inline image, a tool, a call and its response, a system instruction
    and generation settings: in the SDKs' camelCase, or in snake_case as Google's REST
    examples write it."""

    def name(camel: str, snake_name: str) -> str:
        return snake_name if snake else camel

    declaration = {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "OBJECT", "properties": {"path": {"type": "STRING"}}},
    }
    return {
        name("systemInstruction", "system_instruction"): {"parts": [{"text": "be brief"}]},
        "contents": [
            user(
                {"text": "what is in this picture?"},
                {
                    name("inlineData", "inline_data"): {
                        name("mimeType", "mime_type"): "image/png",
                        "data": PNG,
                    }
                },
            ),
            {
                "role": "model",
                "parts": [
                    {
                        name("functionCall", "function_call"): {
                            "name": "read_file",
                            "args": {"path": "a.txt"},
                        }
                    }
                ],
            },
            user(
                {
                    name("functionResponse", "function_response"): {
                        "name": "read_file",
                        "response": {"output": "the file's text"},
                    }
                }
            ),
        ],
        "tools": [{name("functionDeclarations", "function_declarations"): [declaration]}],
        name("toolConfig", "tool_config"): {
            name("functionCallingConfig", "function_calling_config"): {"mode": "AUTO"}
        },
        name("generationConfig", "generation_config"): {
            name("maxOutputTokens", "max_output_tokens"): 300,
            "temperature": 0.5,
        },
    }


@pytest.mark.parametrize("snake", [False, True])
async def test_inline_images_and_both_spellings_reach_a_chat_deployment(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, sim: Simulator, snake: bool
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream)
    status, answer = await post(proxy, "chat-model", image_request(snake))
    assert status == 200, answer
    assert answer["candidates"][0]["content"]["role"] == "model"
    sent = sim.requests[-1].body
    system, question, call, result = sent["messages"]
    assert system == {"role": "system", "content": "be brief"}
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    assert question["content"] == [{"type": "text", "text": "what is in this picture?"}, image]
    [tool_call] = call["tool_calls"]
    assert tool_call["function"] == {"name": "read_file", "arguments": '{"path":"a.txt"}'}
    assert result == {"role": "tool", "tool_call_id": tool_call["id"], "content": "the file's text"}
    [tool] = sent["tools"]
    assert tool["function"]["name"] == "read_file"
    assert tool["function"]["parameters"]["properties"]["path"] == {"type": "string"}
    assert sent["tool_choice"] == "auto"
    assert sent["max_tokens"] == 300 and sent["temperature"] == 0.5


@pytest.mark.parametrize("snake", [False, True])
async def test_inline_images_and_both_spellings_reach_a_native_deployment_as_sent(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, sim: Simulator, snake: bool
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream)
    body = image_request(snake)
    status, answer = await post(proxy, "gemini-native", body, key=OTHER)
    assert status == 200, answer
    assert orjson.dumps(sim.requests[-1].body) == orjson.dumps(body)  # key order too
