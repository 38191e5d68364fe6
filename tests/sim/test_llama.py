"""The llama-cpp-python twin refuses what the real server (0.3.36) refused, the same way."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.support.sim_llama import LlamaCppSimulator

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


async def post(url: str, body: dict[str, Any], **headers: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as r:
        return r.status, await r.read()


async def test_a_request_id_that_is_not_a_uuid_gets_400_with_an_empty_body(
    aiohttp_server: Any,
) -> None:
    sim = LlamaCppSimulator()
    url = str((await aiohttp_server(sim.app())).make_url("/v1/chat/completions"))
    hi = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert await post(url, hi, **{"X-Request-Id": "0123456789abcdef01234567"}) == (400, b"")
    status, _ = await post(url, hi, **{"X-Request-Id": "6f1c0e52-4a8e-4d7c-9b1e-2f5a7c3d9e10"})
    assert status == 200
    assert (await post(url, hi))[0] == 200
    assert [r.status for r in sim.requests] == [400, 200, 200]


async def test_a_null_assistant_content_gets_a_500_validation_error(aiohttp_server: Any) -> None:
    sim = LlamaCppSimulator()
    url = str((await aiohttp_server(sim.app())).make_url("/v1/chat/completions"))
    messages: list[Any] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    status, body = await post(url, {"model": "m", "messages": messages})
    assert status == 500
    assert b"1 validation error:" in body and b"'ChatCompletionRequestAssistantMessage', " in body
    assert b"'content'), 'msg': 'Input should be a valid string', 'input': None}" in body
    messages[1]["content"] = ""
    assert (await post(url, {"model": "m", "messages": messages}))[0] == 200
