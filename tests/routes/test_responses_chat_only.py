"""POST /v1/responses for an `openai/` deployment whose server speaks only chat completions
(llama.cpp, vLLM without /v1/responses): its 404 on the route teaches the proxy to send the
request as chat, at once and from then on; OpenAI's own 404 for an unknown model stays a 404.
Real sockets: the openai SDK, the proxy, and an aiohttp upstream on 127.0.0.1."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.upstream.missing_routes import lacks_route
from tests.conftest import ProxyFactory

KEY = "sk-proxy-chat-only-1"
MODEL_NOT_FOUND = {
    "error": {
        "message": "The model `gpt-x` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": None,
        "code": "model_not_found",
    }
}
CHAT_REPLY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "local",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello from chat"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
}


class ChatOnly:
    """A server with /v1/chat/completions only: anything else is FastAPI's 404."""

    def __init__(self, not_found: Any = None) -> None:
        self.hits: list[str] = []
        self.not_found = not_found if not_found is not None else {"detail": "Not Found"}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        self.hits.append(request.path)
        if request.method == "POST" and request.path == "/v1/chat/completions":
            body = await request.json()
            assert not body.get("stream"), "a translated request is asked for whole"
            return web.json_response(CHAT_REPLY)
        return web.json_response(self.not_found, status=404)


Starter = Callable[[ChatOnly], Awaitable[openai.AsyncOpenAI]]


@pytest.fixture
async def started(start_proxy: ProxyFactory, tmp_path: Path) -> AsyncIterator[Starter]:
    opened: list[Any] = []

    async def start(upstream: ChatOnly) -> openai.AsyncOpenAI:
        server = TestServer(upstream.app(), host="127.0.0.1")
        await server.start_server()
        opened.append(server)
        url = str(server.make_url("")).rstrip("/")
        text = f"""\
            store: {{path: {tmp_path / "state"}}}
            keys:
              api_keys: [{{name: agent, key: {KEY}}}]
            model_list:
              - model_name: local
                litellm_params:
                  model: openai/local
                  api_base: {url}/v1
                  api_key: sk-upstream
            """
        path = tmp_path / "chat-only.yaml"
        path.write_text(textwrap.dedent(text))
        proxy = await start_proxy(path)
        sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key=KEY, max_retries=0)
        opened.append(sdk)
        return sdk

    yield start
    for thing in reversed(opened):
        await thing.close()


async def test_a_chat_only_server_answers_responses_as_chat(
    started: Starter, caplog: pytest.LogCaptureFixture
) -> None:
    upstream = ChatOnly()
    sdk = await started(upstream)
    raw = await sdk.responses.with_raw_response.create(model="local", input="hi")
    assert raw.parse().output_text == "hello from chat"
    assert "compat.responses_as_chat" in raw.headers.get("x-agentproxy-applied", "")
    assert upstream.hits == ["/v1/responses", "/v1/chat/completions"]
    # Learnt: the next request, streamed this time, goes straight to chat.
    stream = await sdk.responses.create(model="local", input="again", stream=True)
    events = [event async for event in stream]
    done = [e for e in events if e.type == "response.completed"]
    assert done and done[0].response.output_text == "hello from chat"
    assert upstream.hits == ["/v1/responses", "/v1/chat/completions", "/v1/chat/completions"]
    later = await sdk.responses.with_raw_response.create(model="local", input="hi")
    assert "compat.responses_as_chat" in later.headers.get("x-agentproxy-applied", "")
    said = [r for r in caplog.records if "serves no /v1/responses" in r.getMessage()]
    assert len(said) == 1 and "'local'" in said[0].getMessage()  # once per deployment


async def test_a_first_streamed_request_is_answered_as_chat(started: Starter) -> None:
    upstream = ChatOnly(not_found="Not Found")  # a plain-text 404 says the same
    sdk = await started(upstream)
    stream = await sdk.responses.create(model="local", input="hi", stream=True)
    events = [event async for event in stream]
    done = [e for e in events if e.type == "response.completed"]
    assert done and done[0].response.output_text == "hello from chat"
    assert upstream.hits == ["/v1/responses", "/v1/chat/completions"]


async def test_openai_model_not_found_stays_a_404(started: Starter) -> None:
    upstream = ChatOnly(not_found=MODEL_NOT_FOUND)
    sdk = await started(upstream)
    for _ in range(2):
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.responses.create(model="local", input="hi")
        assert "does not exist" in str(caught.value)
    assert upstream.hits == ["/v1/responses", "/v1/responses"]


@pytest.mark.parametrize(
    ("status", "body", "lacks"),
    [
        (404, b'{"detail":"Not Found"}', True),
        (404, b"<html>404 Not Found</html>", True),
        (404, b'{"error":{"message":"File Not Found"}}', True),
        (404, orjson.dumps(MODEL_NOT_FOUND), False),
        (404, b'{"error":{"message":"x","type":"invalid_request_error"}}', False),
        (400, b'{"detail":"Not Found"}', False),
    ],
)
def test_only_a_404_that_is_not_openais_says_the_route_is_missing(
    status: int, body: bytes, lacks: bool
) -> None:
    assert lacks_route(status, body) is lacks
