"""A client's body never steers where (or how) the proxy calls a provider: fields that litellm
would read as call settings (api_base, base_url, api_key, custom_llm_provider, extra_headers,
mock_response, ...) are dropped on the litellm path and ignored for routing on the fast path.

Each test sends them pointing at a "catcher" server on loopback, which must receive nothing,
while the configured upstream (the simulator) receives the call with the configured key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory

KEY = "sk-operator-provider-secret"
CLIENT_KEY = "sk-client-own-key"


@dataclass
class Setup:
    proxy: TestServer
    sim: Simulator
    caught: list[tuple[str, dict[str, str], bytes]]
    catcher_url: str


@pytest.fixture
async def setup(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> AsyncIterator[Setup]:
    caught: list[tuple[str, dict[str, str], bytes]] = []

    async def catch(request: web.Request) -> web.Response:
        caught.append((request.path, dict(request.headers), await request.read()))
        return web.json_response({"error": {"message": "caught"}}, status=418)

    catcher_app = web.Application()
    catcher_app.router.add_route("*", "/{tail:.*}", catch)
    catcher = await aiohttp_server(catcher_app)
    sim = Simulator(api_key=KEY)
    upstream = await aiohttp_server(sim.app())
    sim_url = str(upstream.make_url("")).rstrip("/")
    path = tmp_path / "c.yaml"
    path.write_text(
        f"""
store: {{path: {tmp_path}}}
model_list:
  - model_name: claude
    litellm_params:
      model: anthropic/claude-sim
      api_base: {sim_url}
      api_key: {KEY}
      max_tokens: 256
  - model_name: gpt
    litellm_params:
      model: openai/gpt-sim
      api_base: {sim_url}/v1
      api_key: {KEY}
policies:
  - name: one-attempt
    retry: {{attempts: 1}}
"""
    )
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession() as http:
        for _ in range(600):  # litellm is imported in the background; /readyz says when
            async with http.get(str(proxy.make_url("/readyz"))) as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.05)
    yield Setup(proxy, sim, caught, str(catcher.make_url("")).rstrip("/"))


def steering(catcher: str) -> dict[str, Any]:
    """Every field a hostile body might use to move the call, all aimed at the catcher."""
    return {
        "api_base": catcher,
        "base_url": catcher + "/v1",
        "api_key": CLIENT_KEY,
        "custom_llm_provider": "openai",
        "extra_headers": {"x-stolen": "1"},
        "headers": {"x-stolen": "1"},
        "extra_body": {"stolen": True},
        "mock_response": "mocked by the client",
        "metadata": {"stolen": True},
        "litellm_params": {"api_base": catcher},
        "api_version": "2099-01-01",
        "deployment_id": "stolen",
        "organization": "stolen",
        "timeout": 0.001,
    }


async def post(setup: Setup, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.post(
            str(setup.proxy.make_url(path)),
            json=body,
            headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        ) as r,
    ):
        return r.status, await r.read()


def answer_text(raw: bytes) -> str:
    """The assistant's text of a chat completion, whole or streamed."""
    if not raw.startswith(b"data:"):
        return str(orjson.loads(raw)["choices"][0]["message"]["content"])
    chunks = [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def assert_went_to_the_configured_upstream(setup: Setup, path: str) -> None:
    assert setup.caught == []
    assert [r.path for r in setup.sim.requests] == [path]
    recorded = setup.sim.requests[0]
    assert recorded.api_key == KEY
    assert "x-stolen" not in recorded.headers


@pytest.mark.parametrize("stream", [False, True])
async def test_litellm_path_ignores_steering_fields(setup: Setup, stream: bool) -> None:
    body = {
        "model": "claude",
        "messages": [{"role": "user", "content": "hello claude"}],
        "stream": stream,
        **steering(setup.catcher_url),
    }
    status, raw = await post(setup, "/v1/chat/completions", body)
    assert status == 200, raw
    assert "mocked" not in answer_text(raw)
    assert answer_text(raw) == "You said: hello claude"
    assert_went_to_the_configured_upstream(setup, "/v1/messages")
    assert "stolen" not in orjson.dumps(setup.sim.requests[0].body).decode()


async def test_base_url_alone_cannot_move_a_litellm_call(setup: Setup) -> None:
    body = {
        "model": "claude",
        "messages": [{"role": "user", "content": "hi"}],
        "base_url": setup.catcher_url,
        "custom_llm_provider": "anthropic",
    }
    status, raw = await post(setup, "/v1/chat/completions", body)
    assert status == 200, raw
    assert_went_to_the_configured_upstream(setup, "/v1/messages")


async def test_responses_client_translated_to_litellm_ignores_steering(setup: Setup) -> None:
    body = {"model": "claude", "input": "hello there", **steering(setup.catcher_url)}
    status, raw = await post(setup, "/v1/responses", body)
    assert status == 200, raw
    assert_went_to_the_configured_upstream(setup, "/v1/messages")


@pytest.mark.parametrize("stream", [False, True])
async def test_fast_path_routes_by_configuration_only(setup: Setup, stream: bool) -> None:
    body = {
        "model": "gpt",
        "messages": [{"role": "user", "content": "hello gpt"}],
        "stream": stream,
        **steering(setup.catcher_url),
    }
    status, raw = await post(setup, "/v1/chat/completions", body)
    assert status == 200, raw
    assert b"mocked by the client" not in raw
    assert_went_to_the_configured_upstream(setup, "/v1/chat/completions")


async def test_native_anthropic_routes_by_configuration_only(setup: Setup) -> None:
    body = {
        "model": "claude",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hello claude"}],
        **steering(setup.catcher_url),
    }
    status, raw = await post(setup, "/v1/messages", body)
    assert status == 200, raw
    assert_went_to_the_configured_upstream(setup, "/v1/messages")


async def test_native_responses_routes_by_configuration_only(setup: Setup) -> None:
    body = {"model": "gpt", "input": "hello gpt", **steering(setup.catcher_url)}
    status, raw = await post(setup, "/v1/responses", body)
    assert status == 200, raw
    assert_went_to_the_configured_upstream(setup, "/v1/responses")
