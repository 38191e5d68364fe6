"""The circuit breaker per session: an agent that keeps sending a failing request is stopped.

After `circuit.session_failures` consecutive failed requests, the session's next request is
refused (429 `session_circuit_open`, no upstream call) while it is the same request again — the
same number of messages and the same last message. A changed request goes through, as a probe:
success closes the session's circuit, failure keeps it open for that request in turn.

The count lives in the session's guard record in the state store (store/guard_record.py), so
replicas share it; without the store (Redis down) the session is let through, as if it had not
failed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from proxy.control.outcome import SessionCircuitOpen
from proxy.exchange import Exchange
from proxy.logs.limit import warn_limited
from proxy.recording.recorder import Recorder
from proxy.store import guard_record
from proxy.store.base import StoreError
from proxy.store.state import StateStore

log = logging.getLogger("agentproxy.control")
PART = "circuit"  # this guard's part of the session's guard record


@dataclass(slots=True)
class _Failing:
    failures: int  # consecutive failed requests
    signature: int  # of the last one
    last_status: int | None

    def to_json(self) -> list[Any]:
        return [self.failures, self.signature, self.last_status]

    @classmethod
    def from_json(cls, value: Any) -> _Failing | None:
        try:
            failures, signature, last_status = value
        except (TypeError, ValueError):
            return None  # none kept (or another version's): as if it had not failed
        return cls(failures, signature, last_status)


def signature(messages: list[dict[str, Any]]) -> int:
    last = orjson.dumps(messages[-1]) if messages else b""
    return xxhash.xxh3_64_intdigest(last, seed=len(messages))


class SessionCircuits:
    def __init__(self, state: StateStore, recorder: Recorder) -> None:
        self.state = state
        self.recorder = recorder

    async def check(self, ex: Exchange) -> None:
        """Before anything else: refuse a failing session's unchanged request."""
        limit = _limit(ex)
        if limit is None:
            return
        failing = await self._read(ex)
        ex.recovery.session_failing = failing is not None
        if failing is None or failing.failures < limit:
            return
        if failing.signature != signature(ex.messages):
            return  # changed: let it through as a probe
        if ex.dry_run:
            self.recorder.record(ex, "session_circuit", "would_refuse", count=failing.failures)
            return
        self.recorder.record(ex, "session_circuit", "refused", count=failing.failures)
        raise SessionCircuitOpen(ex.identity.session_name, failing.failures, failing.last_status)

    async def settle(self, ex: Exchange, ok: bool) -> None:
        """After the request: a success closes the session's circuit, a failure counts."""
        if _limit(ex) is None:
            return
        try:
            if ok:  # the usual success costs no write: the record has no failures to clear
                await guard_record.write(self.state, ex, PART, None)
                return
            messages = (
                ex.client.original_messages
                if ex.client.original_messages is not None
                else ex.messages
            )
            failing = await self._read(ex)
            failures = failing.failures + 1 if failing is not None else 1
            streak = _Failing(failures, signature(messages), ex.recovery.last_status)
            await guard_record.write(self.state, ex, PART, streak.to_json())
        except StoreError as exc:
            warn_limited(log, "session_circuit.update", "session circuit of request %s not "
                         "updated: %s", ex.identity.request_id, exc)  # fmt: skip

    async def _read(self, ex: Exchange) -> _Failing | None:
        return _Failing.from_json((await guard_record.read(self.state, ex)).get(PART))


def _limit(ex: Exchange) -> int | None:
    spec = ex.policy.circuit
    return spec.session_failures if spec.enabled else None
