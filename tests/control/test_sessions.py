from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.control.outcome import SessionCircuitOpen
from proxy.control.sessions import SessionCircuits
from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.policies.spec import CircuitSpec, Policy
from proxy.recording.events import EventLog
from proxy.recording.recorder import Recorder
from proxy.store import guard_record
from proxy.store.base import StoreError
from proxy.store.state import MemoryState
from tests.control.fakes import exchange

POLICY = Policy(name="p", circuit=CircuitSpec(session_failures=2))


def request(text: str, policy: Policy = POLICY) -> Exchange:
    messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    ex = exchange(policy, messages=messages)
    ex.client.original_messages = messages
    ex.recovery.last_status = 400
    return ex


def circuits(state: Any = None) -> SessionCircuits:
    return SessionCircuits(state or MemoryState(), Recorder(Metrics(), EventLog(None)))


async def test_a_failing_session_is_refused_until_its_request_changes() -> None:
    sessions = circuits()
    for _ in range(2):
        ex = request("same")
        await sessions.check(ex)
        await sessions.settle(ex, ok=False)
    with pytest.raises(SessionCircuitOpen) as caught:
        await sessions.check(request("same"))
    error = caught.value
    assert error.status == 429 and error.headers["x-should-retry"] == "false"
    assert error.body("r")["error"]["upstream_status"] == 400  # type: ignore[index]
    changed = request("something else")
    await sessions.check(changed)  # goes through, as a probe
    await sessions.settle(changed, ok=False)
    with pytest.raises(SessionCircuitOpen):
        await sessions.check(request("something else"))
    await sessions.check(request("same"))  # no longer the last request


async def test_success_closes_and_no_limit_means_no_breaker() -> None:
    state = MemoryState()
    sessions = circuits(state)
    for ok in (False, True, False):
        ex = request("same")
        await sessions.check(ex)
        await sessions.settle(ex, ok=ok)
    await sessions.check(request("same"))  # one failure since the success
    unlimited = Policy(name="q")
    for _ in range(5):
        await sessions.settle(request("same", unlimited), ok=False)
    await sessions.check(request("same", unlimited))
    record = orjson.loads(await state.get(guard_record.SPACE, "s1") or b"{}")
    assert "circuit" in record  # one failure is on record


async def test_dry_run_notes_instead_of_refusing() -> None:
    sessions = circuits()
    dry = Policy(name="d", mode="dry_run", circuit=CircuitSpec(session_failures=1))
    await sessions.settle(request("same", dry), ok=False)
    ex = request("same", dry)
    await sessions.check(ex)
    assert [(n.stage, n.action) for n in ex.notes] == [("session_circuit", "would_refuse")]


async def test_without_its_state_a_session_is_let_through() -> None:
    sessions = circuits(Unreachable())
    for _ in range(3):
        ex = request("same")
        await sessions.check(ex)  # no StoreError escapes: the request goes on
        await sessions.settle(ex, ok=False)


class Unreachable(MemoryState):
    """A state store whose every operation fails, as Redis does while down."""

    async def get(self, space: str, key: str) -> bytes | None:
        raise StoreError("down")

    async def set(self, space: str, key: str, value: bytes, ttl_s: float | None = None) -> None:
        raise StoreError("down")
