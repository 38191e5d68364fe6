"""openai-agents (its default model, OpenAIResponsesModel) through the proxy's /v1/responses,
against the strict Responses twin: a function tool round trip, run whole and streamed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory

from .test_codex_proxy import PROXY_KEY, UPSTREAM_KEY, proxy_for

set_tracing_disabled(True)  # its traces would go to OpenAI: nothing leaves loopback here


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def agents_proxy(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, sim: Simulator
) -> TestServer:
    upstream: TestServer = await aiohttp_server(sim.app())
    url = str(upstream.make_url("")).rstrip("/")
    return await proxy_for(start_proxy, tmp_path, url, window=100_000)


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_agent_calls_its_tool_through_the_proxy(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, streamed: bool
) -> None:
    sim = Simulator(api_key=UPSTREAM_KEY)
    proxy = await agents_proxy(start_proxy, tmp_path, aiohttp_server, sim)
    async with openai.AsyncOpenAI(
        base_url=str(proxy.make_url("/v1")), api_key=PROXY_KEY, max_retries=0
    ) as client:
        model = OpenAIResponsesModel(model="sim-codex", openai_client=client)
        agent = Agent(name="weather", instructions="Use tools.", model=model, tools=[get_weather])
        ask = "what is the weather in Paris? use get_weather"
        if streamed:
            run = Runner.run_streamed(agent, ask)
            async for _ in run.stream_events():
                pass
            final = run.final_output
        else:
            final = (await Runner.run(agent, ask)).final_output
    assert "sunny in" in str(final)
    outputs = [
        item
        for item in sim.requests[-1].body["input"]
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    assert outputs and "sunny in" in str(outputs[-1]["output"])
    assert all(r.status == 200 for r in sim.requests)
