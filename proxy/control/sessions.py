"""The circuit breaker per session: an agent that keeps sending a failing request is stopped.

After `circuit.session_failures` consecutive failed requests, the session's next request is
refused (429 `session_circuit_open`, no upstream call) while it is the same request again — the
same number of messages and the same last message. A changed request goes through, as a probe:
success closes the session's circuit, failure keeps it open for that request in turn.

The count lives in the state store, so replicas share it; without the store (Redis down) the
session is let through, as if it had not failed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from proxy.control.outcome import SessionCircuitOpen
from proxy.exchange import Exchange
from proxy.recorder import Recorder
from proxy.store.base import StoreError
from proxy.store.state import StateStore

log = logging.getLogger("agentproxy.control")
SPACE = "session_failures"
TTL_S = 86_400.0  # a session that went quiet for a day starts afresh


@dataclass(slots=True)
class _Failing:
    failures: int  # consecutive failed requests
    signature: int  # of the last one
    last_status: int | None

    def to_bytes(self) -> bytes:
        return orjson.dumps([self.failures, self.signature, self.last_status])

    @classmethod
    def from_bytes(cls, data: bytes) -> _Failing:
        failures, signature, last_status = orjson.loads(data)
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
        failing = await self._read(ex.session)
        ex.recovery.session_failing = failing is not None
        if failing is None or failing.failures < limit:
            return
        if failing.signature != signature(ex.messages):
            return  # changed: let it through as a probe
        if ex.dry_run:
            self.recorder.record(ex, "session_circuit", "would_refuse", count=failing.failures)
            return
        self.recorder.record(ex, "session_circuit", "refused", count=failing.failures)
        raise SessionCircuitOpen(ex.session_name, failing.failures, failing.last_status)

    async def settle(self, ex: Exchange, ok: bool) -> None:
        """After the request: a success closes the session's circuit, a failure counts."""
        if _limit(ex) is None:
            return
        try:
            if ok:
                if ex.recovery.session_failing:  # the usual success costs no write
                    await self.state.delete(SPACE, ex.session)
                return
            messages = ex.original_messages if ex.original_messages is not None else ex.messages
            failing = await self._read(ex.session)
            failures = failing.failures + 1 if failing is not None else 1
            record = _Failing(failures, signature(messages), ex.recovery.last_status)
            await self.state.set(SPACE, ex.session, record.to_bytes(), TTL_S)
        except StoreError as exc:
            log.warning("session circuit of request %s not updated: %s", ex.request_id, exc)

    async def _read(self, session: str) -> _Failing | None:
        try:
            data = await self.state.get(SPACE, session)
        except StoreError:
            return None  # no state: the session is let through, as if new
        return _Failing.from_bytes(data) if data else None


def _limit(ex: Exchange) -> int | None:
    spec = ex.policy.circuit
    return spec.session_failures if spec.enabled else None
