"""Circuit breakers per deployment: in memory, one object per application; with a shared
state store (Redis) an opened circuit is published and every replica opens it too (`follow`).

    closed ──`circuit.failures` consecutive transient failures──▶ open
    open ──`cooldown_s` later, the next caller takes the one probe──▶ half_open
    half_open ──the probe succeeds──▶ closed      half_open ──the probe fails──▶ open

While the probe is out, every other caller finds the deployment open; a probe that never
finishes (its client left) hands the probe to the next caller. Only transient failures count:
a provider answering 400 is up.

And no tenant may close a deployment for the others (issue 29). A failure that says the
deployment is down (unreachable, 429, 502, 503, 529) counts every time, whoever saw it. One
that a single request can draw on every retry (an HTTP 500 or another 5xx; a timeout, which a
huge prompt can cause) names a culprit and counts once per culprit: with more than one tenant
the culprit is the owner (key or team), so a key alone, however many session ids it invents,
counts once, and the circuit opens at `circuit.failures` culprits or when every tenant there
is has failed; with one tenant (no keys), the culprit is the session. A deployment is named
`alias#index` (its place among the alias' deployments), which keeps metric labels bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.logs.limit import warn_limited
from proxy.metrics import Metrics
from proxy.policies.spec import CircuitSpec, Deployment
from proxy.store.base import StoreError
from proxy.store.state import StateStore

log = logging.getLogger("agentproxy.control")

State = Literal["closed", "half_open", "open"]
GAUGE = {"closed": 0, "half_open": 1, "open": 2}
SPACE = "circuits"  # published open circuits: field = deployment key, value = reopen time
FOLLOW_INTERVAL_S = 1.0


@dataclass(slots=True)
class Breaker:
    state: State = "closed"
    failures: int = 0  # consecutive transient failures
    retry_at: float = 0.0  # when open: the clock time the probe may go
    probing: bool = False  # when half-open: the probe is out
    # Culprits (owners, or sessions of the one tenant) whose failure, perhaps caused by their
    # own request, counted in this streak: at most `circuit.failures` of them (the circuit
    # opens, and this is cleared, at that count).
    blamed: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Permit:
    """Leave to call one deployment once; its outcome must be reported."""

    key: str
    probe: bool = False


def deployment_key(deployment: Deployment, group: tuple[Deployment, ...]) -> str:
    """`alias#index`: the deployment's place among its alias' deployments."""
    index = next((i for i, d in enumerate(group) if d is deployment), 0)
    return f"{deployment.alias}#{index}"


class Circuits:
    def __init__(
        self,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        state: StateStore | None = None,
    ) -> None:
        self.metrics = metrics
        self.clock = clock
        self.state = state  # shared with other replicas, when not in process memory
        self._publishing: set[asyncio.Task[None]] = set()
        self._breakers: dict[str, Breaker] = {}
        # id(deployment) -> (deployment, key): every call looks its deployment's key up.
        self._keys: dict[int, tuple[Deployment, str]] = {}

    def key(self, deployment: Deployment, group: tuple[Deployment, ...]) -> str:
        """deployment_key, cached (configs are immutable; a reload brings new objects)."""
        cached = self._keys.get(id(deployment))
        if cached is not None and cached[0] is deployment:
            return cached[1]
        if len(self._keys) >= 4096:  # deployments of configs long replaced
            self._keys.clear()
        key = deployment_key(deployment, group)
        self._keys[id(deployment)] = (deployment, key)
        return key

    def usable(self, key: str) -> bool:
        """Would `enter` let a call through now? (No side effects: for routing.)"""
        breaker = self._breakers.get(key)
        if breaker is None or breaker.state == "closed":
            return True
        if breaker.state == "open":
            return self.clock() >= breaker.retry_at
        return not breaker.probing

    def enter(self, key: str) -> Permit | None:
        """A permit to call the deployment, or None while its circuit is open."""
        breaker = self._breakers.get(key)
        if breaker is None or breaker.state == "closed":
            return Permit(key)
        if breaker.state == "open":
            if self.clock() < breaker.retry_at:
                return None
            self._move(key, breaker, "half_open")
        if breaker.probing:
            return None  # someone else's probe is out: open for everyone else
        breaker.probing = True
        return Permit(key, probe=True)

    def succeeded(self, permit: Permit) -> None:
        breaker = self._breakers.get(permit.key)
        if breaker is None:
            return
        breaker.failures = 0
        breaker.blamed.clear()
        if permit.probe:
            breaker.probing = False
            self._move(permit.key, breaker, "closed")

    def failed(
        self,
        permit: Permit,
        spec: CircuitSpec,
        culprit: str | None = None,
        culprits: int | None = None,
    ) -> None:
        """A transient failure of a call made under `permit`. `culprit`: who may have caused
        it (an owner, or a session), counted once per streak; None: the failure is the
        deployment's, whoever called. `culprits`: how many there can be (the tenants), if
        known; when every one of them has failed the circuit opens even below `failures`."""
        breaker = self._breakers.get(permit.key)
        if breaker is None:
            breaker = self._breakers[permit.key] = Breaker()
            self.metrics.child(self.metrics.circuit_state, permit.key).set(0)
        if permit.probe:
            breaker.probing = False
            self._open(permit.key, breaker, spec)
        elif breaker.state == "closed":
            if culprit is not None:
                if culprit in breaker.blamed:
                    return  # this culprit's requests again: no news about the deployment
                breaker.blamed.add(culprit)
            breaker.failures += 1
            everyone = culprits is not None and len(breaker.blamed) >= culprits
            if breaker.failures >= spec.failures or everyone:
                self._open(permit.key, breaker, spec)

    def released(self, permit: Permit) -> None:
        """The call ended without a verdict (cancelled, or a proxy bug): free the probe."""
        breaker = self._breakers.get(permit.key)
        if permit.probe and breaker is not None:
            breaker.probing = False

    def retry_in(self, key: str) -> float:
        """Seconds until the deployment takes a call again (0 if it would now)."""
        breaker = self._breakers.get(key)
        if breaker is None or breaker.state != "open":
            return 0.0
        return max(0.0, breaker.retry_at - self.clock())

    def failures(self, key: str) -> int:
        breaker = self._breakers.get(key)
        return breaker.failures if breaker is not None else 0

    def describe(self) -> dict[str, Any]:
        """Every deployment that ever failed, for GET /admin/policies."""
        return {
            key: {
                "state": breaker.state,
                "consecutive_failures": breaker.failures,
                "retry_in_s": round(self.retry_in(key), 3) if breaker.state == "open" else None,
                "probe_in_flight": breaker.probing,
            }
            for key, breaker in sorted(self._breakers.items())
        }

    async def follow(self, interval_s: float = FOLLOW_INTERVAL_S) -> None:
        """Open the circuits other replicas opened (runs for the app's life)."""
        while True:
            await asyncio.sleep(interval_s)
            with contextlib.suppress(StoreError):  # counted by the store; try again later
                self.learn(await self.state.published(SPACE) if self.state else {})

    def learn(self, opened: dict[str, float]) -> None:
        """`opened`: deployment key -> wall-clock time its circuit may take a probe again."""
        now_wall, now = time.time(), self.clock()
        for key, until in opened.items():
            breaker = self._breakers.get(key)
            if breaker is None:
                breaker = self._breakers[key] = Breaker()
            retry_at = now + (until - now_wall)
            if breaker.state == "closed" and retry_at > now:
                breaker.retry_at = retry_at
                self._move(key, breaker, "open")

    def _open(self, key: str, breaker: Breaker, spec: CircuitSpec) -> None:
        breaker.retry_at = self.clock() + spec.cooldown_s
        breaker.blamed.clear()
        self._move(key, breaker, "open")
        if self.state is not None and self.state.backend != "memory":
            task = asyncio.ensure_future(self._publish(key, spec.cooldown_s))
            self._publishing.add(task)
            task.add_done_callback(self._publishing.discard)

    async def _publish(self, key: str, cooldown_s: float) -> None:
        assert self.state is not None
        try:
            await self.state.publish(SPACE, key, time.time() + cooldown_s, cooldown_s)
        except StoreError as exc:
            warn_limited(log, "circuit.publish", "circuit %s opened here only: %s", key, exc)

    def _move(self, key: str, breaker: Breaker, state: State) -> None:
        breaker.state = state
        self.metrics.child(self.metrics.circuit_state, key).set(GAUGE[state])
        self.metrics.child(self.metrics.circuit_transitions, key, state).inc()
