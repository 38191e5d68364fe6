"""Degraded mode: when every recovery fails, a normal answer explains the outage."""

from __future__ import annotations

import openai
import pytest

from proxy.sim.simulator import Fault, Simulator
from tests.conftest import SimProxyFactory, base_url

POLICY = """
policies:
  - name: keep-going
    degraded: true
    retry: {attempts: 2, base_s: 0.01}
"""


@pytest.mark.parametrize("stream", [False, True])
async def test_an_outage_becomes_an_answer_the_agent_can_read(
    proxy_for: SimProxyFactory, stream: bool
) -> None:
    sim = Simulator()
    proxy = await proxy_for(sim, POLICY)
    sim.inject(Fault(status=503, times=10))
    client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused", max_retries=0)
    raw = await client.chat.completions.with_raw_response.create(
        model="sim", messages=[{"role": "user", "content": "hi"}], stream=stream
    )
    assert raw.headers["x-agentproxy-degraded"] == "true"
    if stream:
        text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
    else:
        text = raw.parse().choices[0].message.content or ""
    assert text.startswith(
        "[agentproxy] The model is unavailable right now (upstream answered 503)"
    )
    assert "retry" in text
    assert len(sim.requests) == 2  # the retries happened first


async def test_the_clients_own_errors_are_not_hidden(proxy_for: SimProxyFactory) -> None:
    sim = Simulator()
    proxy = await proxy_for(sim, POLICY)
    sim.inject(Fault(status=400, body={"error": {"message": "bad", "type": "invalid"}}))
    client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "hi"}]
        )
