"""Control for one model call of a request: fallback ⊃ retry ⊃ fit-to-context ⊃ upstream call.

    with_fallbacks       the alias, then its fallbacks in order, each re-fitted (fallback.py)
      with_retries       the one retry loop, transient failures only (retry.py)
        _attempt         a deployment whose circuit lets the call through (circuit.py), the
                         session's own with `routing.affinity: session` (affinity.py)
          _fit_and_call  on "context exceeded": compact tighter, call once more
            _call        one upstream call, under the attempt timeout and the deadline

Fitting is the caller's to offer (`fitter`, the rewriter): a request's history is fitted again
for each fallback and tighter after an overflow; a call the proxy makes itself (a summary) is
sent as built, and never re-enters compaction.

Everything that happens is counted (metrics), noted (x-agentproxy-applied, event log) and, when
it all fails, told in the error (outcome.py). Costs nothing on the way to a first success but
a circuit lookup.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

from proxy.control import affinity
from proxy.control.affinity import Affinity
from proxy.control.backoff import Timing
from proxy.control.circuit import Circuits, Permit
from proxy.control.classify import blames_deployment, classify, is_slow
from proxy.control.downgrade import Downgrade
from proxy.control.fallback import with_fallbacks
from proxy.control.outcome import CircuitOpen, decorate
from proxy.control.retry import with_retries
from proxy.control.sessions import SessionCircuits
from proxy.errors import ProxyError, UpstreamTimeout
from proxy.exchange import Exchange
from proxy.messages import CHAT
from proxy.metrics import Metrics
from proxy.policies.spec import Deployment, ErrorClass, Keys
from proxy.recording.recorder import Recorder
from proxy.sessions.identity import owner_of
from proxy.store.state import StateStore
from proxy.tracing import call_span, replied
from proxy.tracing import span as trace_span
from proxy.upstream.base import Upstream, UpstreamHTTPError, UpstreamReply, UpstreamStream
from proxy.upstream.overflow import stated_tokens
from proxy.upstream.priming import prime

if TYPE_CHECKING:
    from opentelemetry.trace import Span


class Router(Protocol):
    def pick(
        self,
        deployments: tuple[Deployment, ...],
        usable: Callable[[Deployment], bool] | None = None,
    ) -> Deployment: ...

    def for_deployment(self, deployment: Deployment, wire: str = CHAT) -> Upstream: ...


class Fitter(Protocol):
    """Fits a request's history to its target model (the rewriter's hooks)."""

    async def refit(self, ex: Exchange) -> None:
        """A fallback took over: fit the client's history to it."""

    async def after_overflow(self, ex: Exchange) -> bool:
        """The provider said the context is exceeded: compact tighter. False = give up."""

    async def after_rejection(self, ex: Exchange, error: UpstreamHTTPError) -> bool:
        """The provider refused the request as invalid: adapt it to that deployment (a
        compatibility shim). False = nothing to change."""


class Control:
    def __init__(
        self,
        router: Router,
        metrics: Metrics,
        state: StateStore,
        recorder: Recorder,
        timing: Timing | None = None,
    ) -> None:
        self.router = router
        self.metrics = metrics
        self.recorder = recorder
        self.timing = timing or Timing()
        self.circuits = Circuits(metrics, self.timing.clock, state)
        self.sessions = SessionCircuits(state, recorder)
        self.affinity = Affinity(state, self.circuits.key)
        self._tenants_of: tuple[Keys | None, int] = (None, 1)

    # --- around the request ------------------------------------------------------------------

    async def route(self, ex: Exchange) -> None:
        """The deployment of `ex.alias` to fit the history to and call: the session's own
        (affinity.py) or, with `routing.affinity: none`, round-robin; deployments whose circuit
        is open skipped."""
        group = ex.config.deployments[ex.alias]
        if not affinity.applies(ex, group):
            ex.deployment = self._pick(ex, ex.alias)
            return
        await self.affinity.load(ex)
        ex.deployment = self._pick(ex, ex.alias)
        home = self.affinity.order(ex, ex.alias, group)[0]
        if ex.deployment is not home:  # its circuit is open: moved before the history is fitted
            self._say_moved(ex, home, "circuit_open")

    async def downgrade(self, ex: Exchange, exhausted: Downgrade, fitter: Fitter) -> None:
        """A budget past its limit moves the request to its cheaper alias (downgrade.py): the
        alias becomes the target and the client's history is fitted to it, as for a fallback;
        again if another budget moves it on. Each budget moves a request once (its guard sees
        to it), so this ends within the policy's budgets."""
        while True:
            served = ex.alias
            ex.recovery.downgrades.append(exhausted.budget)
            await self._retarget(ex, exhausted.alias, f"downgrade to {exhausted.alias}")
            self._visible(ex, "budget", "downgraded", budget=exhausted.budget,
                          limit=exhausted.limit, model=served, to=exhausted.alias)  # fmt: skip
            try:
                return await fitter.refit(ex)
            except Downgrade as further:
                exhausted = further

    async def admit(self, ex: Exchange) -> None:
        """Refuse a failing session's unchanged request (a structured 429) before any work."""
        await self.sessions.check(ex)

    async def settle(self, ex: Exchange, ok: bool) -> None:
        await self.sessions.settle(ex, ok)
        await self.affinity.settle(ex, ok)

    def describe(self) -> dict[str, Any]:
        return {"deployments": self.circuits.describe()}

    # --- one model call -----------------------------------------------------------------------

    @overload
    async def call(
        self, ex: Exchange, *, stream: Literal[False], fitter: Fitter | None = None
    ) -> UpstreamReply: ...

    @overload
    async def call(
        self, ex: Exchange, *, stream: Literal[True], fitter: Fitter | None = None
    ) -> UpstreamStream: ...

    async def call(
        self, ex: Exchange, *, stream: bool, fitter: Fitter | None = None
    ) -> UpstreamReply | UpstreamStream:
        """An UpstreamReply (or, with `stream`, an opened UpstreamStream) from `ex.alias` or one
        of its fallbacks; a failure comes out marked for the client (outcome.decorate).
        Without a `fitter` the body goes out as it is, to every alias tried."""
        recovery = ex.recovery
        deadline_s = ex.policy.retry.deadline_s
        if deadline_s is not None and recovery.deadline is None:
            spent = time.perf_counter() - ex.timing.started  # the deadline covers the whole request
            recovery.deadline = self.timing.clock() + deadline_s - spent
        switched: list[tuple[str, str, ErrorClass]] = []  # the fallback in force, if any

        def run() -> Awaitable[Any]:  # the alias' own run costs no coroutine more than before
            if not switched:
                return self._with_retries(ex, stream, fitter)
            return self._fallen_back(ex, stream, fitter, *switched[-1])

        async def switch(alias: str, reason: ErrorClass) -> None:
            switched.append((ex.alias, alias, reason))
            await self._switch(ex, alias, reason, fitter)

        try:
            return await with_fallbacks(
                ex,
                run,
                switch,
                usable=lambda alias: self._alias_usable(ex, alias),
                time_left=lambda: self._has_time(ex),
            )
        except Exception as error:
            kind = classify(error, ex.policy.retry.classify)
            if kind is not None:
                decorate(error, ex, kind)
            raise

    async def _with_retries(self, ex: Exchange, stream: bool, fitter: Fitter | None) -> Any:
        alias = ex.alias
        retried = 0

        def on_retry(kind: ErrorClass, delay: float) -> None:
            nonlocal retried
            retried += 1
            self.metrics.child(self.metrics.retries, alias, kind).inc()
            ex.timing.upstream_wait += delay  # waiting for the upstream, not the proxy's own time

        try:
            return await with_retries(
                lambda number: self._attempt(ex, stream, number, fitter),
                ex.policy.retry,
                ex.recovery,
                self.timing,
                attempts=1 if ex.dry_run else None,
                on_retry=on_retry,
            )
        except Exception:
            transient = ex.recovery.last_class == "transient"
            if ex.dry_run and transient and ex.policy.retry.attempts > 1:
                self._visible(ex, "retry", "would_retry", model=alias)
            raise
        finally:
            if retried:
                self._visible(ex, "retry", "retried", count=retried, model=alias)

    async def _fallen_back(
        self,
        ex: Exchange,
        stream: bool,
        fitter: Fitter | None,
        failed: str,
        to: str,
        reason: ErrorClass,
    ) -> Any:
        """A fallback alias' run, as one span (its attempts below it)."""
        attributes = {"agentproxy.from": failed, "agentproxy.to": to, "agentproxy.reason": reason}
        with trace_span("agentproxy.fallback", attributes):
            return await self._with_retries(ex, stream, fitter)

    async def _switch(
        self, ex: Exchange, alias: str, reason: ErrorClass, fitter: Fitter | None
    ) -> None:
        """Fall back: `alias` becomes the target, and the client's history is fitted to it."""
        failed = ex.alias
        await self._retarget(ex, alias, f"fallback to {alias}")
        self.metrics.child(self.metrics.fallbacks, failed, alias, reason).inc()
        self._visible(ex, "fallback", "fell_back", model=failed, to=alias, reason=reason)
        if fitter is not None:
            try:
                await fitter.refit(ex)
            except Downgrade as exhausted:  # the new alias is past a budget with a cheaper one
                await self.downgrade(ex, exhausted, fitter)

    async def _retarget(self, ex: Exchange, alias: str, step: str) -> None:
        """`alias` becomes the request's target (a fallback, a budget's downgrade), on the
        session's own deployment of it when affinity applies."""
        ex.alias = alias
        if affinity.applies(ex, ex.config.deployments[alias]):
            await self.affinity.load(ex)
        ex.deployment = self._pick(ex, alias)
        ex.recovery.steps.append(step)

    async def _attempt(self, ex: Exchange, stream: bool, number: int, fitter: Fitter | None) -> Any:
        fitted = ex.deployment  # what the history was fitted to
        if number > 1:
            ex.deployment = self._repick(ex)
        permit = self._permit(ex)
        try:
            if ex.deployment is not fitted and fitted is not None:
                await self._moved(ex, fitted, "failed" if number > 1 else "circuit_open", fitter)
            result = await self._fit_and_call(ex, stream, fitter)
        except Exception as error:
            if permit is not None:
                self._report(ex, permit, error, classify(error, ex.policy.retry.classify))
            raise
        except BaseException:  # cancelled: no verdict on the deployment
            if permit is not None:
                self.circuits.released(permit)
            raise
        if permit is not None:
            self.circuits.succeeded(permit)
        return result

    async def _fit_and_call(self, ex: Exchange, stream: bool, fitter: Fitter | None) -> Any:
        """After "context exceeded", compact tighter and call once more; after a refusal a
        compatibility shim fixes, call once more with it. Each at most once."""
        tried: set[str] = set()
        while True:
            try:
                return await self._call(ex, stream)
            except UpstreamHTTPError as error:
                if fitter is None:
                    raise
                step = await self._fix(ex, error, fitter, tried)
                if step is None:
                    raise
                tried.add(step)
                ex.recovery.steps.append(step)

    async def _fix(
        self, ex: Exchange, error: UpstreamHTTPError, fitter: Fitter, tried: set[str]
    ) -> str | None:
        """What was changed so the request is worth sending again, or None."""
        kind = classify(error, ex.policy.retry.classify)
        if kind == "overflow" and "compaction" not in tried:
            ex.recovery.overflow = stated_tokens(error.body)
            return "compaction" if await fitter.after_overflow(ex) else None
        if kind == "logical" and "compatibility" not in tried:
            return "compatibility" if await fitter.after_rejection(ex, error) else None
        return None

    async def _call(self, ex: Exchange, stream: bool) -> Any:
        deployment = ex.deployment
        assert deployment is not None
        limit, which = self._time_limit(ex)
        if limit is not None and limit <= 0:
            raise self._timed_out(ex, which)
        upstream = self.router.for_deployment(deployment, ex.wire_for(deployment))
        ex.recovery.calls += 1
        waited = time.perf_counter()
        with call_span(ex, ex.recovery.calls) as span:
            try:
                if limit is None:  # the common case: no timer to set
                    return await self._send(ex, upstream, deployment, stream, span)
                try:
                    async with asyncio.timeout(limit) as scope:
                        return await self._send(ex, upstream, deployment, stream, span)
                except TimeoutError:
                    if not scope.expired():
                        raise
                    raise self._timed_out(ex, which) from None
            except UpstreamHTTPError as error:
                self._failed(ex, f"http_{error.status}", error.status)
                raise
            except ProxyError as error:
                if error.unsent:  # refused before any call: no upstream failed
                    ex.recovery.last_status = None
                else:
                    self._failed(ex, error.code or error.type, None)
                raise
            finally:
                ex.timing.upstream_wait += time.perf_counter() - waited

    @staticmethod
    async def _send(
        ex: Exchange, upstream: Upstream, deployment: Deployment, stream: bool, span: Span | None
    ) -> Any:
        body, headers = ex.outgoing(deployment)
        ex.sent = body
        try:
            if stream:
                opened = await upstream.open_stream(
                    deployment, body, ex.identity.request_id, headers
                )
                return await prime(opened, deployment.alias)
            reply = await upstream.complete(deployment, body, ex.identity.request_id, headers)
        except asyncio.CancelledError:  # the client left (or a time limit cut the call) mid-call
            ex.add_unreported_usage()
            raise
        usage = upstream.usage(reply.data)
        ex.add_usage(usage)
        if span is not None:
            replied(span, ex, reply.data, usage)
        return reply

    # --- helpers --------------------------------------------------------------------------------

    def _pick(self, ex: Exchange, alias: str) -> Deployment:
        group = ex.config.deployments[alias]
        usable = self._usable(ex, group)
        if affinity.applies(ex, group):
            return self.affinity.place(ex, alias, group, usable)
        return self.router.pick(group, usable)

    def _repick(self, ex: Exchange) -> Deployment:
        """A retry's deployment: the session's next one after the one that failed, or with
        `routing.affinity: none` the next in turn (retries spread over the deployments)."""
        group = ex.config.deployments[ex.alias]
        failed = ex.deployment
        if failed is None or not affinity.applies(ex, group):
            return self._pick(ex, ex.alias)
        return self.affinity.after(ex, ex.alias, group, failed, self._usable(ex, group))

    def _usable(self, ex: Exchange, group: tuple[Deployment, ...]) -> affinity.Usable:
        if len(group) == 1 or not ex.policy.circuit.enabled:
            return None
        return lambda d: self.circuits.usable(self.circuits.key(d, group))

    async def _moved(
        self, ex: Exchange, left: Deployment, reason: str, fitter: Fitter | None
    ) -> None:
        """The session's deployment failed or is cooling down, and another of the alias takes
        it: with affinity, said and counted, and the history re-fitted to it (as a fallback's)."""
        if not affinity.applies(ex, ex.config.deployments[ex.alias]):
            return  # round-robin: deployments of an alias are taken as interchangeable
        self._say_moved(ex, left, reason)
        if fitter is not None:
            await fitter.refit(ex)

    def _say_moved(self, ex: Exchange, left: Deployment, reason: str) -> None:
        group = ex.config.deployments[ex.alias]
        assert ex.deployment is not None
        to = self.circuits.key(ex.deployment, group)
        ex.recovery.steps.append(f"moved to {to}")
        self.metrics.child(self.metrics.affinity_moves, ex.alias, reason).inc()
        fields = {"from": self.circuits.key(left, group), "to": to, "reason": reason}
        self._visible(ex, "routing", "moved", model=ex.alias, **fields)

    def _alias_usable(self, ex: Exchange, alias: str) -> bool:
        if not ex.policy.circuit.enabled:
            return True
        group = ex.config.deployments[alias]
        return any(self.circuits.usable(self.circuits.key(d, group)) for d in group)

    def _permit(self, ex: Exchange) -> Permit | None:
        """Leave to call ex.deployment, or another deployment of the alias if its circuit is
        open (ex.deployment then changes); CircuitOpen when every one is open."""
        if not ex.policy.circuit.enabled:
            return None
        first = ex.deployment
        assert first is not None
        group = ex.config.deployments[ex.alias]
        permit = self.circuits.enter(self.circuits.key(first, group))
        if permit is not None:
            return permit
        others: Iterable[Deployment] = group
        if affinity.applies(ex, group):
            others = self.affinity.order(ex, ex.alias, group)  # the session's next first
        for other in others:
            if other is not first and (
                permit := self.circuits.enter(self.circuits.key(other, group))
            ):
                ex.deployment = other
                return permit
        key = self.circuits.key(first, group)
        if ex.dry_run:
            self._visible(ex, "circuit", "would_skip", deployment=key)
            return None
        retry_in = min(self.circuits.retry_in(self.circuits.key(d, group)) for d in group)
        self.metrics.child(self.metrics.upstream_errors, ex.alias, "circuit_open").inc()
        ex.recovery.last_status = None
        raise CircuitOpen(ex.alias, self.circuits.failures(key), retry_in)

    def _report(
        self, ex: Exchange, permit: Permit, error: Exception, kind: ErrorClass | None
    ) -> None:
        if kind == "transient":
            culprit, culprits = self._culprit(ex, error)
            self.circuits.failed(permit, ex.policy.circuit, culprit, culprits)
        elif kind in ("logical", "overflow"):
            self.circuits.succeeded(permit)  # the provider answered: it is up
        else:
            self.circuits.released(permit)

    def _culprit(self, ex: Exchange, error: Exception) -> tuple[str | None, int | None]:
        """Who may have caused a transient failure, and how many such there can be (circuit.py):
        none for the deployment's own failure. With more than one tenant, the owner, so one
        key alone never opens the circuit for the others; with one, the session, and a timeout
        counts every time (no one else could have caused it)."""
        if blames_deployment(error):
            return None, None
        tenants = self._tenants(ex.config.keys)
        if tenants > 1:
            return ex.identity.owner, tenants
        return (None, None) if is_slow(error) else (ex.identity.session, None)

    def _tenants(self, keys: Keys) -> int:
        """How many owners the configured keys make (1 without keys), cached per config."""
        if self._tenants_of[0] is not keys:
            owners = {owner_of(key, keys) for key in keys.api_keys}
            self._tenants_of = (keys, max(1, len(owners)))
        return self._tenants_of[1]

    def _failed(self, ex: Exchange, reason: str, status: int | None) -> None:
        ex.recovery.last_status = status
        self.metrics.child(self.metrics.upstream_errors, ex.alias, reason).inc()

    def _time_left(self, ex: Exchange) -> float | None:
        deadline = ex.recovery.deadline
        return None if deadline is None else deadline - self.timing.clock()

    def _has_time(self, ex: Exchange) -> bool:
        left = self._time_left(ex)
        return left is None or left > 0

    def _time_limit(self, ex: Exchange) -> tuple[float | None, str]:
        """Time allowed for the next upstream call, and which setting limits it."""
        limit = ex.policy.retry.attempt_timeout_s
        left = self._time_left(ex)
        if left is not None and (limit is None or left < limit):
            return left, "deadline_s"
        return limit, "attempt_timeout_s"

    def _timed_out(self, ex: Exchange, which: str) -> UpstreamTimeout:
        retry = ex.policy.retry
        if which == "deadline_s":
            return UpstreamTimeout(
                f"the request's deadline, retry.deadline_s ({retry.deadline_s:g}s) of policy "
                f"'{ex.policy.name}', ran out waiting on the upstream for '{ex.alias}'; raise it "
                "to allow more time"
            )
        return UpstreamTimeout(
            f"the upstream for '{ex.alias}' did not answer within retry.attempt_timeout_s "
            f"({retry.attempt_timeout_s:g}s) of policy '{ex.policy.name}'; raise it if this "
            "model needs longer"
        )

    def _visible(self, ex: Exchange, stage: str, action: str, **fields: Any) -> None:
        self.recorder.record(ex, stage, action, **fields)
