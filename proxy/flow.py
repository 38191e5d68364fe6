"""One exchange from admission to charge, in one place; knows no wire format.

A route (proxy/wire/<format>/route.py) parses its request into the Exchange and hands it to
`Flow.serve` with its `Answers`; from there the path is, in order:

    trace     a request span around all of it, when tracing is on
    admit     which conversation (a fingerprinted one: its branch), then the guards (rate
              limits, session circuit; loops and budgets run with the rewrites), may refuse:
              with our headers
    route     the deployment to fit the history to and call
    rewrite   the rewrite chain's before_call hooks: repair, offload, fit to the window, offer
              recall when something left the context (proxy/pipeline)
    call      control: fallback ⊃ retry ⊃ fit-to-context ⊃ upstream call (proxy/control)
    recall    the model called the proxy's own tool: answer it and call again, bounded rounds
    relay     the answer in the client's wire (its Answers: a reply, or a stream relayed)
    errors    a provider's error in the client's envelope; the proxy's own raised for the HTTP
              shell to frame (proxy/http/middleware.py); an upstream failure the policy
              degrades answered with the wire's degraded answer instead
    settle    the session circuit learns the outcome
    charge    usage, cost and time to metrics and budgets, whatever happened (the client gone
              included: shielded from its cancellation); the rate limits' slot given back

What differs between formats comes in as small readers: where a reply's message is, how to take
the proxy's calls out of it, and (streaming) a relay that writes the client's events.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from aiohttp import web

from proxy import eager, tracing
from proxy.control.control import Control
from proxy.control.downgrade import Downgrade
from proxy.errors import InternalError, ProxyError, status_of
from proxy.exchange import Exchange, Usage
from proxy.guards import tool_rules
from proxy.guards.rate_limits import Lease, RateLimiter
from proxy.guards.secrets.restore import UNRESTORED
from proxy.guards.tool_rules import Verdict
from proxy.http.auth import presented_key
from proxy.http.headers import proxy_headers
from proxy.http.keys import OUTCOME_STATUS, RAW_BODY, STATUS_CLIENT_GONE
from proxy.messages import Message
from proxy.metrics import Metrics
from proxy.model_catalog import ModelCatalog
from proxy.pipeline import recall
from proxy.pipeline.rewriter import Rewriter
from proxy.policies.spec import Deployment
from proxy.recording.recorder import Recorder
from proxy.recording.sessions import Finished, secrets_of
from proxy.sessions.lineage import Lineage
from proxy.store.activity import Activity
from proxy.store.base import Store
from proxy.tracing import Tracing
from proxy.tracing import span as trace_span
from proxy.upstream.base import UpstreamHTTPError, UpstreamReply, UpstreamStream

log = logging.getLogger("agentproxy")


class Held(Protocol):
    """Tool calls a relay kept from the client until its stream ended."""

    def message(self) -> Message: ...


class Relay(Protocol):
    """Writes one streamed answer to the client, over the upstream streams of every round."""

    hold_tool_calls: bool
    # Whether a call of this tool is held until complete (a guard rule could match it).
    watch_tool: Callable[[str], bool] | None

    @property
    def started(self) -> bool: ...

    async def run(self, source: UpstreamStream) -> Any: ...  # Held | None

    async def release(self, held: Any, verdict: Verdict | None) -> None: ...

    async def fail(self, error: ProxyError | UpstreamHTTPError) -> None: ...


class Replies(Protocol):
    """Reads a non-streamed reply in the client's wire format (a dialect module is one)."""

    def reply_message(self, reply: UpstreamReply) -> Message: ...

    def without_recall(
        self, reply: UpstreamReply, theirs: list[dict[str, Any]]
    ) -> UpstreamReply: ...

    def refused(self, reply: UpstreamReply, verdict: Verdict) -> UpstreamReply:
        """The reply without the calls the guard denied, saying why (the wire's shape)."""
        ...


class Answers(Protocol):
    """How one wire format answers a request: a reply, a stream, a provider's error, a
    degraded answer (each route's, e.g. proxy/wire/chat/route.py: ChatWire)."""

    async def complete(self, ex: Exchange, flow: Flow) -> web.Response: ...

    async def stream(
        self, request: web.Request, ex: Exchange, flow: Flow
    ) -> web.StreamResponse: ...

    def upstream_error(self, ex: Exchange, error: UpstreamHTTPError) -> web.Response: ...

    def degraded(self, ex: Exchange, error: Exception) -> web.Response: ...


StreamFailure = ProxyError | UpstreamHTTPError


class Flow:
    def __init__(
        self,
        control: Control,
        rewriter: Rewriter,
        store: Store,
        catalog: ModelCatalog,
        metrics: Metrics,
        recorder: Recorder,
        activity: Activity | None = None,
        lineage: Lineage | None = None,
        tracing: Tracing | None = None,
        *,
        settles_inline: bool = False,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.control = control
        self.limiter = limiter  # rate limits (None: none can apply)
        # `finish` waits on nothing (the guards' and budgets' state is in-process): a route
        # may run it in its own task, at once (proxy/eager.py).
        self.settles_inline = settles_inline
        self.tracing = tracing  # None: tracing is off
        self.lineage = lineage
        self.rewriter = rewriter
        self.store = store
        self.catalog = catalog
        self.metrics = metrics
        self.recorder = recorder
        self.activity = activity  # sessions' activity, for the store's retention

    def serve(
        self, request: web.Request, ex: Exchange, answers: Answers
    ) -> Awaitable[web.StreamResponse]:
        """The request, end to end: the order above."""
        if self.tracing is None:  # no coroutine more than untraced serving needs
            return self._serve(request, ex, answers)
        return self._traced(request, ex, answers, self.tracing)

    async def _traced(
        self, request: web.Request, ex: Exchange, answers: Answers, tracer: Tracing
    ) -> web.StreamResponse:
        with tracer.request(ex, request.headers) as span:
            response = await self._serve(request, ex, answers)
            tracing.responded(span, request.get(OUTCOME_STATUS, response.status))
            return response

    async def _serve(
        self, request: web.Request, ex: Exchange, answers: Answers
    ) -> web.StreamResponse:
        """`_respond`, then the turn to the recorder (the sessions board; the recording of a
        session whose policy records it), whatever the outcome."""
        recorded = ex.policy.record.enabled
        if recorded and ex.client.stream:
            ex.streamed = []  # the relay keeps what it writes
        response: web.StreamResponse | None = None
        failure: ProxyError | None = None
        try:
            response = await self._respond(request, ex, answers)
            return response
        except ProxyError as error:
            failure = error
            raise
        finally:
            self._finished(request, ex, response, failure, recorded)

    def _finished(
        self,
        request: web.Request,
        ex: Exchange,
        response: web.StreamResponse | None,
        failure: ProxyError | None,
        recorded: bool,
    ) -> None:
        if failure is not None:
            status = failure.status
        elif response is None:
            status = STATUS_CLIENT_GONE  # cancelled: the client left
        else:
            status = request.get(OUTCOME_STATUS, response.status)
        turn = None
        if recorded:
            # A whole answer as it came, its placeholders not given back (guards/secrets/).
            body = (
                response.get(UNRESTORED, response.body)
                if isinstance(response, web.Response)
                else None
            )
            turn = Finished(
                ex,
                request.get(RAW_BODY),
                status,
                body if isinstance(body, bytes) else None,
                None if failure is None else _error_fields(failure),
                secrets_of(ex.config, presented_key(request)),
            )
        self.recorder.finished(ex, status, turn)

    async def _respond(
        self, request: web.Request, ex: Exchange, answers: Answers
    ) -> web.StreamResponse:
        try:  # guards (rate limits, session circuit, loops, budgets) may refuse: say so
            lease = await self.admit(ex)
        except ProxyError as error:
            error.headers.update(proxy_headers(ex))
            raise
        ok = False
        try:
            if ex.client.stream:
                response: web.StreamResponse = await answers.stream(request, ex, self)
            else:
                response = await answers.complete(ex, self)
            ok = True
            return response
        except UpstreamHTTPError as error:  # what control gave up on: counted there
            if self.degrades(ex, error):
                return answers.degraded(ex, error)
            return answers.upstream_error(ex, error)
        except ProxyError as error:
            self.count_failure(ex, error)
            if self.degrades(ex, error):
                return answers.degraded(ex, error)
            error.headers.update(proxy_headers(ex))
            raise
        finally:
            if ex.failure is not None:  # a stream that began, then failed: the request failed
                request[OUTCOME_STATUS] = status_of(ex.failure)
            # A client that leaves cancels this handler, maybe in the middle of charging it:
            # the charging runs to its end regardless (what was used is always charged).
            # Against in-process state it never waits: run at once, no task (proxy/eager.py).
            finishing = self.finish(ex, ok, lease)
            rest = eager.start(finishing) if self.settles_inline else finishing
            if rest is not None:
                await asyncio.shield(rest)

    async def admit(self, ex: Exchange) -> Lease | None:
        """Admit, route and rewrite; a guard's refusal comes out as a ProxyError. The rate
        limits' lease, if any, is the caller's to give back (`finish`)."""
        if self.lineage is not None:  # first: which conversation, so whose state
            await self.lineage.resolve(ex)
        # Then the rate limits: a refusal costs no other work, and no store write.
        lease = await self.limiter.admit(ex) if self.limiter is not None else None
        activity = self.activity
        try:
            if activity is not None:
                cold = activity.arrive(ex.identity.session)
                if cold is not None:  # its first request here: the store learns of it first
                    await cold
            await self.control.admit(ex)
            await self.control.route(ex)
            try:
                await self.rewriter.before_call(ex)
            except Downgrade as exhausted:  # a spent budget sends it to a cheaper alias
                await self.control.downgrade(ex, exhausted, self.rewriter)
        except BaseException:  # refused or gone: finish (which would say so) never runs
            if activity is not None:
                activity.leave(ex.identity.session)
            if lease is not None and self.limiter is not None:
                await asyncio.shield(self.limiter.release(ex, lease))
            raise
        return lease

    async def complete(self, ex: Exchange, replies: Replies) -> UpstreamReply:
        """The answer, the recall rounds done and the proxy's own calls taken out."""
        reply: UpstreamReply = await self.control.call(ex, stream=False, fitter=self.rewriter)
        rounds = ex.policy.recall.max_rounds
        for round_ in range(rounds + 1):
            message = replies.reply_message(reply)
            ours, theirs = recall.split_calls(message)
            if not ours:
                break
            if theirs or round_ == rounds:
                reply = replies.without_recall(reply, theirs)
                break
            with trace_span("agentproxy.recall", _round(round_, ours)):
                await self._answer_recall(ex, message, ours, last=round_ + 1 == rounds)
                reply = await self.control.call(ex, stream=False, fitter=self.rewriter)
        if not ex.policy.guard.tool_calls:
            return reply
        verdict = tool_rules.judge(ex, theirs, self.recorder.record, self.metrics)
        return reply if verdict is None else replies.refused(reply, verdict)

    async def open_stream(self, ex: Exchange) -> UpstreamStream:
        """The first round's stream, opened (its headers go into the client's response)."""
        source: UpstreamStream = await self.control.call(ex, stream=True, fitter=self.rewriter)
        return source

    async def relay(self, ex: Exchange, source: UpstreamStream, relay: Relay) -> None:
        """Relay `source` and any recall rounds after it. A failure before the first byte went
        out is raised (the route answers it); after, the stream ends with an error event and
        the request counts as failed."""
        relay.hold_tool_calls = recall.offered(ex.body)
        relay.watch_tool = tool_rules.watcher(ex.policy)
        rounds = ex.policy.recall.max_rounds
        try:
            for round_ in range(rounds + 1):
                try:
                    held = await relay.run(source)
                finally:
                    await source.close()
                if held is None:
                    return
                message = held.message()
                ours, theirs = recall.split_calls(message)
                if not ours or theirs or round_ == rounds:
                    verdict = tool_rules.judge(ex, theirs, self.recorder.record, self.metrics)
                    await relay.release(held, verdict)
                    return
                with trace_span("agentproxy.recall", _round(round_, ours)):
                    await self._answer_recall(ex, message, ours, last=round_ + 1 == rounds)
                    source = await self.control.call(ex, stream=True, fitter=self.rewriter)
        except (ProxyError, UpstreamHTTPError) as error:
            if not relay.started:
                raise
            self.stream_failed(ex, error)
            await relay.fail(error)
        except Exception:
            if not relay.started:
                raise  # the HTTP shell answers it (an internal_error in the client's format)
            # A bug of ours after bytes went out: no other answer can replace the stream, so
            # end it with an error event the client reads rather than leave it hanging.
            request_id = ex.identity.request_id
            log.exception("request %s failed inside the proxy while relaying", request_id)
            failure = InternalError(f"the proxy failed while relaying (request id {request_id})")
            failure.unsent = True  # no upstream's fault: not counted against one
            self.stream_failed(ex, failure)
            await relay.fail(failure)

    def stream_failed(self, ex: Exchange, error: StreamFailure) -> None:
        """A stream that began and then failed is a failed request, everywhere."""
        ex.failure = error
        if isinstance(error, UpstreamHTTPError):
            message = f"upstream answered HTTP {error.status} after the stream began"
        else:
            message = error.message
            self.count_failure(ex, error)
        self.recorder.record(ex, "stream", "failed", status=status_of(error), message=message)

    def count_failure(self, ex: Exchange, error: ProxyError) -> None:
        """A failure outside control's calls (in the relay): counted like control's own."""
        # Control counts (and marks) its own; one raised before any call is no upstream's.
        if not error.extra and not error.unsent:
            reason = error.code or error.type
            self.metrics.child(self.metrics.upstream_errors, ex.alias, reason).inc()

    def degrades(self, ex: Exchange, error: Exception) -> bool:
        """Whether the policy answers this failure with a degraded answer (counted if so): only
        upstream failures degrade, never the client's own errors nor a guard's refusal."""
        if not (ex.policy.degraded and _degradable(error)):
            return False
        self.metrics.child(self.metrics.decisions, "degraded", "answered").inc()
        return True

    def finish(
        self, ex: Exchange, ok: bool, lease: Lease | None = None
    ) -> Coroutine[Any, Any, None]:
        """Settle and charge: runs whatever happened, the client gone included; then the rate
        limits' slot is given back and their tokens corrected, whatever settling did."""
        if lease is None or self.limiter is None:
            return self._finish(ex, ok)  # no coroutine more than settling needs
        return self._finish_and_release(ex, ok, lease, self.limiter)

    async def _finish_and_release(
        self, ex: Exchange, ok: bool, lease: Lease, limiter: RateLimiter
    ) -> None:
        try:
            await self._finish(ex, ok)
        finally:
            await limiter.release(ex, lease)

    async def _finish(self, ex: Exchange, ok: bool) -> None:
        if self.activity is not None:
            self.activity.leave(ex.identity.session)
        succeeded = ok and ex.failure is None
        await self.control.settle(ex, succeeded)
        if succeeded:
            self.rewriter.accepted(ex)
        metrics = self.metrics
        metrics.child(metrics.overhead, ex.client.route).observe(ex.overhead())
        metrics.child(metrics.upstream_duration, ex.alias).observe(ex.timing.upstream_wait)
        if ex.timing.first_token is not None:
            first = ex.timing.first_token - ex.timing.started
            metrics.child(metrics.time_to_first_token, ex.alias).observe(first)
        usage = ex.accounting.usage
        self.rewriter.ctx.meter.learn(ex, usage)  # the provider's count of what was measured
        cost = self._count(ex.alias, ex.deployment, usage)
        # The proxy's own calls for it (summaries), at their model.
        for side in ex.accounting.side_calls:
            side_cost = self._count(side.alias, side.deployment, side.usage)
            if side_cost:
                metrics.child(metrics.summarizer_cost, side.alias).inc(side_cost)
            usage = _total(usage, side.usage)
            cost = side_cost if cost is None else cost + (side_cost or 0.0)
        # Every call to the request's model counts for `calls` budgets: retries, fallbacks and
        # recall rounds included; summaries count in tokens and cost, not as the agent's calls.
        ex.accounting.cost_usd = cost
        await self.rewriter.after_call(ex, usage, cost, calls=ex.recovery.calls)

    def _count(
        self, alias: str, deployment: Deployment | None, usage: Usage | None
    ) -> float | None:
        """Tokens and cost to the metrics, under the model that used them; the cost, if known."""
        if usage is None:
            return None
        metrics = self.metrics
        metrics.child(metrics.tokens, alias, "prompt").inc(usage.prompt_tokens)
        metrics.child(metrics.tokens, alias, "completion").inc(usage.completion_tokens)
        for kind, tokens in (
            ("uncached", usage.uncached),
            ("cache_read", usage.cache_read),
            ("cache_write", usage.cache_write),
        ):
            if tokens:
                metrics.child(metrics.prompt_tokens, alias, kind).inc(tokens)
        cost = self.catalog.cost(deployment, usage) if deployment else None
        if cost:
            metrics.child(metrics.cost, alias).inc(cost)
        return cost

    async def _answer_recall(
        self, ex: Exchange, message: Message, calls: list[dict[str, Any]], *, last: bool
    ) -> None:
        """Answer the model's recall calls and extend the history for the next call. The last
        allowed round goes out without the tool, so the model has to answer."""
        answers = await recall.answer(ex, calls, self.store)
        turn = {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
        ex.body["messages"] = [*ex.messages, turn, *answers]
        self.rewriter.adapt_appended(ex)  # the model's turn may carry a null content
        if last:
            recall.withdraw(ex.body)
        self.recorder.record(ex, "recall", "answered", count=len(calls))


def _error_fields(error: ProxyError) -> dict[str, Any]:
    """The proxy's own error as a recorded event's fields."""
    return {"status": error.status, "type": error.type, "code": error.code,
            "message": error.message}  # fmt: skip


def _round(number: int, calls: list[dict[str, Any]]) -> dict[str, int]:
    """A recall round's span attributes (which round, how many of the proxy's calls)."""
    return {"agentproxy.recall.round": number + 1, "agentproxy.recall.calls": len(calls)}


def _total(one: Usage | None, other: Usage | None) -> Usage | None:
    if one is None or other is None:
        return one or other
    total = Usage()
    total.add(one)
    total.add(other)
    return total


def _degradable(error: Exception) -> bool:
    if isinstance(error, UpstreamHTTPError):
        return error.status >= 500 or error.status == 429
    return isinstance(error, ProxyError) and error.status in (502, 503, 504)
