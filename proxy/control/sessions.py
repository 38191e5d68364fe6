"""The circuit breaker per session: an agent that keeps sending a failing request is stopped.

After `circuit.session_failures` consecutive failed requests, the session's next request is
refused (429 `session_circuit_open`, no upstream call) while it is the same request again — the
same number of messages and the same last message. A changed request goes through, as a probe:
success closes the session's circuit, failure keeps it open for that request in turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import xxhash
from cachetools import LRUCache

from proxy.control.outcome import SessionCircuitOpen
from proxy.exchange import Exchange


@dataclass(slots=True)
class _Failing:
    failures: int  # consecutive failed requests
    signature: int  # of the last one
    last_status: int | None


def signature(messages: list[dict[str, Any]]) -> int:
    last = orjson.dumps(messages[-1]) if messages else b""
    return xxhash.xxh3_64_intdigest(last, seed=len(messages))


class SessionCircuits:
    def __init__(self, sessions: int = 65_536) -> None:
        self._failing: LRUCache[str, _Failing] = LRUCache(sessions)

    def check(self, ex: Exchange) -> None:
        """Before anything else: refuse a failing session's unchanged request."""
        limit = _limit(ex)
        failing = self._failing.get(ex.session) if limit is not None else None
        if failing is None or limit is None or failing.failures < limit:
            return
        if failing.signature != signature(ex.messages):
            return  # changed: let it through as a probe
        if ex.dry_run:
            ex.note("session_circuit", "would_refuse", count=failing.failures)
            return
        ex.note("session_circuit", "refused", count=failing.failures)
        raise SessionCircuitOpen(ex.session, failing.failures, failing.last_status)

    def settle(self, ex: Exchange, ok: bool) -> None:
        """After the request: a success closes the session's circuit, a failure counts."""
        if _limit(ex) is None:
            return
        if ok:
            self._failing.pop(ex.session, None)
            return
        sent = signature(ex.original_messages if ex.original_messages is not None else ex.messages)
        failing = self._failing.get(ex.session)
        failures = failing.failures + 1 if failing is not None else 1
        self._failing[ex.session] = _Failing(failures, sent, ex.recovery.last_status)

    def failing(self) -> int:
        """Sessions whose last request failed (for /admin; ids stay out of it)."""
        return len(self._failing)


def _limit(ex: Exchange) -> int | None:
    spec = ex.policy.circuit
    return spec.session_failures if spec.enabled else None
