"""The litellm path, for real: an `anthropic/...` deployment served by the simulator's Anthropic
Messages twin, driven through the proxy with the openai SDK."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Fault, Simulator
from tests.conftest import ProxyFactory, base_url

KEY = "sk-ant-sim-secret-key"


@pytest.fixture
async def claude_proxy(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> tuple[TestServer, Simulator]:
    sim = Simulator(api_key=KEY)
    upstream = await aiohttp_server(sim.app())
    path = tmp_path / "c.yaml"
    path.write_text(
        f"""
model_list:
  - model_name: claude
    litellm_params:
      model: anthropic/claude-sim
      api_base: {str(upstream.make_url("")).rstrip("/")}
      api_key: {KEY}
      max_tokens: 256
"""
    )
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession() as http:
        for _ in range(600):  # litellm is imported in the background; /readyz says when
            async with http.get(str(proxy.make_url("/readyz"))) as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("/readyz never became ready after litellm loaded")
    return proxy, sim


async def test_non_streaming_through_litellm(claude_proxy: tuple[TestServer, Simulator]) -> None:
    proxy, sim = claude_proxy
    client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused", max_retries=0)
    reply = await client.chat.completions.create(
        model="claude", messages=[{"role": "user", "content": "hello claude"}]
    )
    assert reply.choices[0].message.content == "You said: hello claude"
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert sim.requests[-1].path == "/v1/messages"
    assert sim.requests[-1].body["model"] == "claude-sim"
    assert len(sim.requests) == 1


async def test_streaming_through_litellm(claude_proxy: tuple[TestServer, Simulator]) -> None:
    proxy, _ = claude_proxy
    client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model="claude", messages=[{"role": "user", "content": "stream to me"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "You said: stream to me"


async def test_provider_errors_keep_their_status_and_no_retries(
    claude_proxy: tuple[TestServer, Simulator],
) -> None:
    proxy, sim = claude_proxy
    sim.inject(Fault(status=429, retry_after_ms=20, times=3))
    client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused", max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(
            model="claude", messages=[{"role": "user", "content": "x"}]
        )
    # The proxy's loop made its 3 attempts, waiting as the provider asked; litellm made no
    # retries of its own (else the faults would run out and an attempt would succeed).
    assert len(sim.requests) == 3
    assert caught.value.response.headers["retry-after-ms"] == "20"
    assert caught.value.body["attempts"] == 3  # type: ignore[index]
