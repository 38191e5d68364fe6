"""Control as a whole: fallback ⊃ retry ⊃ fit-to-context ⊃ upstream call, over a scripted
upstream, a real rewriter and a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from proxy.control.control import Control
from proxy.control.outcome import CircuitOpen
from proxy.errors import UpstreamTimeout, UpstreamUnreachable
from proxy.metrics import Metrics
from proxy.pipeline.rewriter import Rewriter
from proxy.policies.spec import CircuitSpec, FallbackSpec, Policy, RetrySpec
from proxy.upstream.base import UpstreamHTTPError, UpstreamReply
from tests.control.fakes import Clock, Router, Script, exchange
from tests.pipeline.factories import context, deployment

OVERFLOW = UpstreamHTTPError(
    400, b'{"error": {"message": "x", "code": "context_length_exceeded"}}', {}
)
FALLBACK = (FallbackSpec(source="sim", to=("backup",)),)


def busy() -> UpstreamHTTPError:
    return UpstreamHTTPError(503, b'{"error": {"message": "busy", "type": "server_error"}}', {})


def control(script: Script, clock: Clock | None = None) -> tuple[Control, Metrics]:
    metrics = Metrics()
    ctx = context()
    timing = (clock or Clock()).timing()
    return Control(Router(script), metrics, ctx.state, ctx.recorder, timing), metrics


def fitter() -> Rewriter:
    """The rewriter, whose hooks the flow offers control: refit, after_overflow."""
    return Rewriter(context())


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_retries_then_answers_and_says_so() -> None:
    script, clock = Script(busy(), busy()), Clock()
    ctl, metrics = control(script, clock)
    ex = exchange(Policy(name="p"))
    reply = await ctl.call(ex, stream=False)
    assert isinstance(reply, UpstreamReply)
    assert len(script.calls) == 3 and clock.slept == [0.5, 1.0]
    assert ex.recovery.calls == 3 and ex.recovery.recoveries() == ["retry x2"]
    assert [(n.stage, n.action, n.fields.get("count")) for n in ex.notes] == [
        ("retry", "retried", 2)
    ]
    retries = "agentproxy_retries_total"
    assert sample(metrics, retries, model="sim", error_class="transient") == 2
    errors = "agentproxy_upstream_errors_total"
    assert sample(metrics, errors, model="sim", reason="http_503") == 2


async def test_giving_up_marks_the_error_for_the_client() -> None:
    script = Script(*[busy()] * 3)
    ctl, _ = control(script)
    ex = exchange(Policy(name="p"))
    with pytest.raises(UpstreamHTTPError) as caught:
        await ctl.call(ex, stream=False)
    error = caught.value
    assert len(script.calls) == 3
    assert error.headers["x-should-retry"] == "false"
    assert error.extra == {
        "class": "transient",
        "attempts": 3,
        "upstream_status": 503,
        "recoveries": ["retry x2"],
        "guidance": "all 3 attempts failed; raise retry.attempts or add a fallback",
        "request_id": "req-1",
    }


async def test_a_logical_error_on_the_first_call_passes_unchanged() -> None:
    script = Script(UpstreamHTTPError(400, b'{"error": {"message": "bad"}}', {}))
    ctl, _ = control(script)
    with pytest.raises(UpstreamHTTPError) as caught:
        await ctl.call(exchange(Policy(name="p", fallbacks=FALLBACK)), stream=False)
    assert len(script.calls) == 1  # no retry, no fallback (`when` is transient, overflow)
    assert caught.value.headers == {"x-should-retry": "false"} and caught.value.extra == {}


async def test_falls_back_after_the_retries_and_refits_the_original_history() -> None:
    script = Script(*[busy()] * 3)
    ctl, metrics = control(script)
    messages = [{"role": "user", "content": "hi"}]
    ex = exchange(Policy(name="p", fallbacks=FALLBACK), messages=messages)
    rewriter = fitter()
    await rewriter.before_call(ex)
    await ctl.call(ex, stream=False, fitter=rewriter)
    assert [model for model, _ in script.calls] == ["sim", "sim", "sim", "backup"]
    assert ex.alias == "backup" and ex.client.requested_alias == "sim"
    assert ex.deployment is not None and ex.deployment.alias == "backup"
    assert script.calls[-1][1]["messages"] == messages
    assert ex.recovery.recoveries() == ["retry x2", "fallback to backup"]
    fallbacks = "agentproxy_fallbacks_total"
    labels = {"from_model": "sim", "to_model": "backup", "reason": "transient"}
    assert sample(metrics, fallbacks, **labels) == 1
    assert ("fallback", "fell_back") in [(n.stage, n.action) for n in ex.notes]


async def test_each_fallback_gets_its_own_retries_and_errors_tell_the_whole_story() -> None:
    script = Script(*[busy()] * 6)
    ctl, _ = control(script)
    ex = exchange(Policy(name="p", fallbacks=FALLBACK))
    with pytest.raises(UpstreamHTTPError) as caught:
        await ctl.call(ex, stream=False)
    assert len(script.calls) == 6
    assert caught.value.extra["recoveries"] == ["retry x2", "fallback to backup", "retry x2"]
    assert caught.value.extra["attempts"] == 6


async def test_overflow_compacts_inside_the_attempt_or_falls_back() -> None:
    # One message cannot be compacted: reactive compaction gives up, the fallback answers.
    script = Script(OVERFLOW)
    ctl, _ = control(script)
    policy = Policy(name="p", fallbacks=(FallbackSpec("sim", ("backup",), when=("overflow",)),))
    ex = exchange(policy)
    await ctl.call(ex, stream=False, fitter=fitter())
    assert [model for model, _ in script.calls] == ["sim", "backup"]
    assert ex.recovery.recoveries() == ["fallback to backup"]


async def test_transient_failures_do_not_fall_back_when_not_asked_to() -> None:
    script = Script(*[busy()] * 3)
    ctl, _ = control(script)
    policy = Policy(name="p", fallbacks=(FallbackSpec("sim", ("backup",), when=("overflow",)),))
    with pytest.raises(UpstreamHTTPError):
        await ctl.call(exchange(policy), stream=False)
    assert len(script.calls) == 3


async def test_an_open_circuit_is_skipped_without_an_upstream_call() -> None:
    script = Script(*[busy()] * 2)
    clock = Clock()
    ctl, metrics = control(script, clock)
    policy = Policy(
        name="p", retry=RetrySpec(attempts=1), circuit=CircuitSpec(failures=2, cooldown_s=5)
    )
    for _ in range(2):
        with pytest.raises(UpstreamHTTPError):
            await ctl.call(exchange(policy), stream=False)
    with pytest.raises(CircuitOpen) as caught:
        await ctl.call(exchange(policy), stream=False)
    assert len(script.calls) == 2
    assert caught.value.headers["retry-after"] == "5" and caught.value.status == 503
    assert caught.value.extra["attempts"] == 0
    assert sample(metrics, "agentproxy_circuit_state", deployment="sim#0") == 2
    # ...and with a fallback the request is served by it, still without calling `sim`.
    with_fallback = Policy(
        name="q", retry=RetrySpec(attempts=1), circuit=CircuitSpec(failures=2), fallbacks=FALLBACK
    )
    ex = exchange(with_fallback)
    await ctl.call(ex, stream=False)
    assert [model for model, _ in script.calls] == ["sim", "sim", "backup"]
    assert ex.alias == "backup"
    # After the cooldown one probe goes through, and its success closes the circuit.
    clock.now += 5
    await ctl.call(exchange(policy), stream=False)
    assert script.calls[-1][0] == "sim"
    assert sample(metrics, "agentproxy_circuit_state", deployment="sim#0") == 0
    assert ctl.describe()["deployments"]["sim#0"]["state"] == "closed"


async def test_routing_prefers_a_closed_deployment_of_the_alias() -> None:
    a = deployment(alias="sim")
    b = deployment(alias="sim", window=4096)
    script = Script(UpstreamUnreachable("reset"))
    ctl, _ = control(script)
    policy = Policy(name="p", retry=RetrySpec(attempts=1), circuit=CircuitSpec(failures=1))
    groups = {"sim": (a, b), "backup": (deployment(alias="backup"),)}
    with pytest.raises(UpstreamUnreachable):
        await ctl.call(exchange(policy, groups), stream=False)
    ex = exchange(policy, groups)
    await ctl.route(ex)
    assert ex.deployment is b
    ex.deployment = a  # even when routed to the open one, the attempt moves on
    await ctl.call(ex, stream=False)
    assert ex.deployment is b


async def test_attempt_timeout_and_deadline_name_their_setting() -> None:
    async def slow() -> UpstreamReply:
        await asyncio.sleep(5)
        raise AssertionError("never reached: the attempt timeout cuts it")

    def real_clock(script: Script) -> Control:
        ctx = context()
        return Control(Router(script), Metrics(), ctx.state, ctx.recorder)

    policy = Policy(name="p", retry=RetrySpec(attempts=2, base_s=0.01, attempt_timeout_s=0.05))
    script = Script(slow)
    ex = exchange(policy)
    await real_clock(script).call(ex, stream=False)  # the slow call is cut, the retry answers
    assert len(script.calls) == 2 and ex.recovery.recoveries() == ["retry x1"]

    with pytest.raises(UpstreamTimeout) as caught:
        await real_clock(Script(slow, slow)).call(exchange(policy), stream=False)
    assert "retry.attempt_timeout_s (0.05s) of policy 'p'" in caught.value.message
    assert caught.value.extra["class"] == "transient" and caught.value.extra["attempts"] == 2

    policy = Policy(name="p", retry=RetrySpec(deadline_s=0.1))
    with pytest.raises(UpstreamTimeout) as caught:
        await real_clock(Script(slow)).call(exchange(policy), stream=False)
    assert "retry.deadline_s (0.1s) of policy 'p'" in caught.value.message
    assert caught.value.extra["attempts"] == 1  # no time left for a retry


async def test_dry_run_makes_one_attempt_and_says_what_it_would_do() -> None:
    script = Script(busy())
    ctl, _ = control(script)
    ex = exchange(Policy(name="p", mode="dry_run", fallbacks=FALLBACK))
    with pytest.raises(UpstreamHTTPError):
        await ctl.call(ex, stream=False)
    assert len(script.calls) == 1
    assert [(n.stage, n.action) for n in ex.notes] == [
        ("retry", "would_retry"),
        ("fallback", "would_fall_back"),
    ]
