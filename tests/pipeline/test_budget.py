"""Budgets: refusal before the call, charging after it, soft limits, windows, roll-up."""

from __future__ import annotations

import calendar
from dataclasses import replace
from typing import Any

import pytest

from proxy.control.downgrade import Downgrade
from proxy.exchange import Exchange, Usage
from proxy.messages import Message
from proxy.pipeline.budget import BudgetExceeded, BudgetStage, window_span
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


def test_a_month_is_the_calendar_month_in_utc() -> None:
    at = calendar.timegm
    assert window_span("month", at((2026, 12, 31, 23, 59, 59))) == (
        at((2026, 12, 1, 0, 0, 0)),
        at((2027, 1, 1, 0, 0, 0)),
    )
    start, end = window_span("month", at((2028, 2, 10, 12, 0, 0))) or (0, 0)
    assert (end - start) / 86400 == 29  # a leap February
    assert window_span("month", at((2026, 3, 1, 0, 0, 0)))[0] == at((2026, 3, 1, 0, 0, 0))  # type: ignore[index]
    assert window_span("lifetime", 1e9) is None


async def test_a_month_keeps_its_own_counters() -> None:
    """On the 1st at 00:00 a day, an hour and a month all start: a month budget of the same
    name as a day budget (another policy's) counts apart."""
    first = float(calendar.timegm((2026, 12, 1, 0, 0, 0)))
    stage, ctx = BudgetStage(clock=lambda: first), context()
    month = policy(BudgetSpec(name="spend", scope="global", window="month", limits={"calls": 1}))
    day = policy(BudgetSpec(name="spend", scope="global", window="day", limits={"calls": 1}))
    await stage.charge(request(month), ctx, None, None, calls=1)
    assert await stage.run(request(day), [USER], ctx) is None
    with pytest.raises(BudgetExceeded):
        await stage.run(request(month), [USER], ctx)


async def test_month_counters_outlive_the_month_by_a_day() -> None:
    now = float(calendar.timegm((2026, 12, 31, 12, 0, 0)))
    written: list[float | None] = []
    stage, ctx = BudgetStage(clock=lambda: now), context()
    add = ctx.state.add

    async def spy(*args: Any, ttl_s: float | None = None, **kwargs: Any) -> Any:
        written.append(ttl_s)
        return await add(*args, ttl_s=ttl_s, **kwargs)

    ctx.state.add = spy  # type: ignore[method-assign]
    p = policy(BudgetSpec(name="m", window="month", limits={"calls": 5}))
    await stage.charge(request(p), ctx, None, None, calls=1)
    assert written == [12 * 3600 + 86400]


async def test_an_exhausted_budget_with_on_exhausted_moves_the_request() -> None:
    stage, ctx = BudgetStage(), context()
    spec = BudgetSpec(name="premium", limits={"calls": 1}, on_exhausted="cheap")
    p = policy(spec, BudgetSpec(name="hard", limits={"calls": 2}))

    def asked(alias: str = "sim", **identity: Any) -> Exchange:
        ex = request(p, **identity)
        ex.config = replace(ex.config, deployments={**ex.config.deployments, "cheap": ()})
        ex.alias = alias
        return ex

    await stage.charge(asked(), ctx, None, None, calls=1)
    ex = asked()
    with pytest.raises(Downgrade) as caught:
        await stage.run(ex, ex.messages, ctx)
    assert (caught.value.alias, caught.value.budget, caught.value.limit) == (
        "cheap", "premium", "calls",
    )  # fmt: skip
    assert caught.value.status == 429 and caught.value.body(None)["error"]["budget"]  # type: ignore[index]
    # On the cheaper alias (after the move, or asked for) the budget lets it through.
    ex.alias = "cheap"
    ex.recovery.downgrades.append("premium")
    assert await stage.run(ex, ex.messages, ctx) is None
    assert await stage.run(asked("cheap"), [USER], ctx) is None
    # Moved once: back on the dear alias (a fallback from the cheap one) it is refused.
    ex.alias = "sim"
    with pytest.raises(BudgetExceeded):
        await stage.run(ex, ex.messages, ctx)
    # A key that may not use the alias is refused as before.
    barred = asked(key=ApiKey(name="k", digest=b"k", models=frozenset({"sim"})))
    with pytest.raises(BudgetExceeded) as refused:
        await stage.run(barred, barred.messages, ctx)
    assert not isinstance(refused.value, Downgrade)
    # A hard cap without on_exhausted still refuses on the cheaper alias.
    await stage.charge(asked(), ctx, None, None, calls=1)
    with pytest.raises(BudgetExceeded) as hard:
        await stage.run(asked("cheap"), [USER], ctx)
    assert hard.value.details["name"] == "hard"


async def test_a_dry_run_says_it_would_downgrade() -> None:
    stage, ctx = BudgetStage(), context()
    spec = BudgetSpec(name="premium", limits={"calls": 1}, on_exhausted="cheap")
    p = replace(policy(spec), mode="dry_run")
    ex = request(p)
    ex.config = replace(ex.config, deployments={**ex.config.deployments, "cheap": ()})
    await stage.charge(request(replace(p, mode="enforce")), ctx, None, None, calls=1)
    assert await stage.run(ex, ex.messages, ctx) is None
    moves = [n.fields for n in ex.notes if n.action == "would_downgrade"]
    assert moves == [{"budget": "premium", "to": "cheap"}]
