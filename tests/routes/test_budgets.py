"""Budgets through the real proxy: refused before the call, charged after it, rolled up."""

from __future__ import annotations

import calendar

import openai
import pytest

from proxy.sim.simulator import Simulator
from proxy.state import FLOW
from tests.conftest import SimProxyFactory, base_url

BUDGETS = """
policies:
  - name: metered
    budgets:
      - {name: per-session, limits: {calls: 2}}
      - {name: tokens, limits: {completion_tokens: 100000}, soft: 0.00001}
"""


async def test_third_call_is_refused_without_reaching_the_model(
    proxy_for: SimProxyFactory,
) -> None:
    sim = Simulator()
    proxy = await proxy_for(sim, BUDGETS)
    client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused")  # SDK retries on
    headers = {"x-agentproxy-session": "agent-1"}
    for _ in range(2):
        await client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
        )
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "budget_exceeded"
    assert body["budget"]["name"] == "per-session" and body["budget"]["spent"] == 2
    assert len(sim.requests) == 2  # the refusal cost no model call, and the SDK did not retry


async def test_subagents_spend_from_their_parent_and_soft_limits_warn(
    proxy_for: SimProxyFactory,
) -> None:
    sim = Simulator()
    proxy = await proxy_for(sim, BUDGETS)
    client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused", max_retries=0)
    for child in ("sub-1", "sub-2"):
        raw = await client.chat.completions.with_raw_response.create(
            model="sim",
            messages=[{"role": "user", "content": "work"}],
            extra_headers={
                "x-agentproxy-session": child,
                "x-agentproxy-parent-session": "lead",
            },
        )
    assert "budget.soft_limit" in raw.headers["x-agentproxy-applied"]
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(
            model="sim",
            messages=[{"role": "user", "content": "and me?"}],
            extra_headers={"x-agentproxy-session": "lead"},
        )


async def test_retries_count_as_model_calls(proxy_for: SimProxyFactory) -> None:
    from proxy.sim.simulator import Fault

    sim = Simulator()
    proxy = await proxy_for(
        sim,
        """
policies:
  - name: metered
    retry: {base_s: 0.01}
    budgets: [{name: calls, limits: {calls: 2}}]
""",
    )
    sim.inject(Fault(status=503))
    client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused", max_retries=0)
    headers = {"x-agentproxy-session": "retrying"}
    await client.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
    )
    assert len(sim.requests) == 2  # one retry
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "again"}], extra_headers=headers
        )


async def test_a_month_window_resets_on_the_first_not_at_midnight(
    proxy_for: SimProxyFactory,
) -> None:
    """The budget's clock is the injected one (the stage's `clock`): a calendar month in UTC,
    from 00:00 on the 1st, outlasts the day boundaries inside it."""
    sim = Simulator()
    proxy = await proxy_for(
        sim,
        """
policies:
  - name: monthly
    budgets: [{name: month, scope: key, window: month, limits: {calls: 2}}]
""",
    )
    now = [calendar.timegm((2026, 12, 30, 22, 0, 0))]
    proxy.app[FLOW].rewriter.budgets.clock = lambda: now[0]
    client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused", max_retries=0)

    async def ask() -> None:
        await client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "hi"}]
        )

    for _ in range(2):
        await ask()
    new_year = calendar.timegm((2027, 1, 1, 0, 0, 0))
    for moment in (now[0], calendar.timegm((2026, 12, 31, 0, 0, 5)), new_year - 1):
        now[0] = moment  # the 30th, past midnight into the 31st, the last second of the month
        with pytest.raises(openai.RateLimitError) as caught:
            await ask()
        body = caught.value.body
        assert isinstance(body, dict) and body["budget"]["window"] == "month"
        assert body["budget"]["resets_at"] == new_year
        assert "2027-01-01 00:00:00 UTC" in body["message"]
        assert caught.value.response.headers["retry-after"] == str(int(new_year - moment))
    assert len(sim.requests) == 2
    now[0] = new_year
    await ask()  # a new month: a new window
    await ask()
    assert len(sim.requests) == 4
    with pytest.raises(openai.RateLimitError) as caught:
        await ask()
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["budget"]["resets_at"] == calendar.timegm((2027, 2, 1, 0, 0, 0))
