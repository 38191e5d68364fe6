from __future__ import annotations

from typing import Any

import pytest

from proxy.control.outcome import SessionCircuitOpen
from proxy.control.sessions import SessionCircuits
from proxy.exchange import Exchange
from proxy.policies.spec import CircuitSpec, Policy
from tests.control.fakes import exchange

POLICY = Policy(name="p", circuit=CircuitSpec(session_failures=2))


def request(text: str, policy: Policy = POLICY) -> Exchange:
    messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    ex = exchange(policy, messages=messages)
    ex.original_messages = messages
    ex.recovery.last_status = 400
    return ex


def test_a_failing_session_is_refused_until_its_request_changes() -> None:
    sessions = SessionCircuits()
    for _ in range(2):
        ex = request("same")
        sessions.check(ex)
        sessions.settle(ex, ok=False)
    with pytest.raises(SessionCircuitOpen) as caught:
        sessions.check(request("same"))
    error = caught.value
    assert error.status == 429 and error.headers["x-should-retry"] == "false"
    assert error.body("r")["error"]["upstream_status"] == 400  # type: ignore[index]
    changed = request("something else")
    sessions.check(changed)  # goes through, as a probe
    sessions.settle(changed, ok=False)
    with pytest.raises(SessionCircuitOpen):
        sessions.check(request("something else"))
    sessions.check(request("same"))  # no longer the last request


def test_success_closes_and_no_limit_means_no_breaker() -> None:
    sessions = SessionCircuits()
    for ok in (False, True, False):
        ex = request("same")
        sessions.check(ex)
        sessions.settle(ex, ok=ok)
    sessions.check(request("same"))  # one failure since the success
    unlimited = Policy(name="q")
    for _ in range(5):
        sessions.settle(request("same", unlimited), ok=False)
    sessions.check(request("same", unlimited))
    assert sessions.failing() == 1


def test_dry_run_notes_instead_of_refusing() -> None:
    sessions = SessionCircuits()
    dry = Policy(name="d", mode="dry_run", circuit=CircuitSpec(session_failures=1))
    sessions.settle(request("same", dry), ok=False)
    ex = request("same", dry)
    sessions.check(ex)
    assert [(n.stage, n.action) for n in ex.notes] == [("session_circuit", "would_refuse")]
