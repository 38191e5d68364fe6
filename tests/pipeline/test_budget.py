"""Budgets: refusal before the call, charging after it, soft limits, windows, roll-up."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.exchange import Exchange, Usage
from proxy.messages import Message
from proxy.pipeline.budget import BudgetExceeded, BudgetStage
from proxy.policies.spec import ApiKey, BudgetSpec, Policy
from tests.pipeline.factories import context, exchange

USER: Message = {"role": "user", "content": "hi"}


def policy(*budgets: BudgetSpec) -> Policy:
    return Policy(name="p", budgets=budgets)


def request(
    stage_policy: Policy, session: str = "s1", body_bytes: int = 400, **identity: Any
) -> Exchange:
    ex = exchange([USER], policy=stage_policy, session=session)
    ex.client.body_bytes = body_bytes
    for name, value in identity.items():  # key, parent_session
        setattr(ex.identity, name, value)
    return ex


async def test_refuses_before_the_call_once_spent() -> None:
    stage, ctx = BudgetStage(), context()
    p = policy(BudgetSpec(name="calls", limits={"calls": 2}))
    for _ in range(2):
        ex = request(p)
        assert await stage.run(ex, ex.messages, ctx) is None
        await stage.charge(ex, ctx, Usage(10, 5), None, calls=1)
    ex = request(p)
    with pytest.raises(BudgetExceeded) as caught:
        await stage.run(ex, ex.messages, ctx)
    error = caught.value.body("req-1")["error"]
    assert isinstance(error, dict)
    assert error["type"] == "budget_exceeded" and caught.value.status == 429
    assert error["budget"]["limit"] == "calls" and error["budget"]["spent"] == 2
    assert error["budget"]["resets_at"] is None  # lifetime budgets never reset
    assert caught.value.headers["x-should-retry"] == "false"
    # Another session has its own budget.
    other = request(p, session="s2")
    assert await stage.run(other, other.messages, ctx) is None


async def test_refuses_a_request_that_would_pass_the_limit() -> None:
    stage, ctx = BudgetStage(), context()
    p = policy(BudgetSpec(name="tokens", limits={"tokens": 1000}))
    ex = request(p, body_bytes=2000)  # ~500 prompt tokens
    ex.body["max_tokens"] = 600
    with pytest.raises(BudgetExceeded) as caught:
        await stage.run(ex, ex.messages, ctx)
    assert "may add 1100" in caught.value.message


async def test_soft_limit_warns_and_asks_to_wrap_up() -> None:
    stage, ctx = BudgetStage(), context()
    p = policy(BudgetSpec(name="cost", limits={"cost_usd": 1.0}, soft=0.5, wrap_up=True))
    ex = request(p)
    await stage.charge(ex, ctx, Usage(1, 1), 0.6, calls=1)
    ex = request(p)
    out = await stage.run(ex, ex.messages, ctx)
    assert out is not None and "Wrap up" in out[-1]["content"] and "60%" in out[-1]["content"]
    assert [(n.action, n.fields["percent"]) for n in ex.notes] == [("soft_limit", 60)]


async def test_windows_reset_and_say_when() -> None:
    stage, ctx = BudgetStage(), context()
    p = policy(BudgetSpec(name="rate", window="minute", limits={"calls": 1}))
    ex = request(p)
    await stage.charge(ex, ctx, None, None, calls=1)
    with pytest.raises(BudgetExceeded) as caught:
        await stage.run(request(p), [USER], ctx)
    assert caught.value.details["resets_at"] % 60 == 0
    assert 1 <= int(caught.value.headers["retry-after"]) <= 60


async def test_a_subagent_spends_from_its_parent() -> None:
    stage, ctx = BudgetStage(), context()
    p = policy(BudgetSpec(name="tree", limits={"calls": 2}))
    for child in ("child-1", "child-2"):
        ex = request(p, session=child, parent_session="parent")
        await stage.charge(ex, ctx, None, None, calls=1)
    parent = request(p, session="parent")
    with pytest.raises(BudgetExceeded):
        await stage.run(parent, parent.messages, ctx)
    third = request(p, session="child-3", parent_session="parent")
    with pytest.raises(BudgetExceeded):
        await stage.run(third, third.messages, ctx)


async def test_key_and_team_scopes() -> None:
    stage, ctx = BudgetStage(), context()
    p = policy(BudgetSpec(name="team", scope="team", limits={"calls": 1}))
    alice = ApiKey(name="alice", digest=b"a", team="red")
    bob = ApiKey(name="bob", digest=b"b", team="red")
    await stage.charge(request(p, key=alice), ctx, None, None, calls=1)
    with pytest.raises(BudgetExceeded):
        ex = request(p, session="other", key=bob)
        await stage.run(ex, ex.messages, ctx)
