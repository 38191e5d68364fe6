"""OpenTelemetry traces of what the proxy did for a request (the `otel` extra), off by default.

    <operation> <alias>        the request (SERVER): session, policy, rewrites, tokens, reasons
      chat <model>             one upstream call (CLIENT): an attempt, a retry, a recall round's
      agentproxy.fallback      the next alias of a fallback chain, its attempts under it
      agentproxy.summary       a summary the proxy asked for, its attempts under it
      agentproxy.recall        a recall round: the proxy answers its own tool, calls again
      agentproxy.store.write   a blob, checkpoint or state write

Off (the default) every span site costs one context-variable read and hands back a shared
no-op: nothing is allocated and opentelemetry is never imported (nor needed: `serve` refuses
`tracing.enabled` without the extra, saying so). On,
the request span puts its tracer in a context variable, so code below it (control, the
summarizer, the store) opens children without being handed anything; work outside a request
(background writes) is not traced. Spans go out in batches from the SDK's own thread (OTLP over
HTTP), never from the event loop. Names, numbers and ids only: never a message or a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from proxy.errors import Failure, ProxyError
from proxy.policies.spec import TracingSettings

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, SpanKind, Tracer

    from proxy.exchange import Exchange, Usage

log = logging.getLogger("agentproxy")

_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()
EXTRA_MISSING = (
    "tracing.enabled needs the otel extra, which is not installed: pip install 'agentproxy[otel]'"
)
_EXTRA_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http")
# Only when the YAML leaves the sampler to the environment; else ours (a ratio, parent-based).
_SAMPLER_VARIABLE = "OTEL_TRACES_SAMPLER"


class _Handling:
    """The request being handled: its tracer, and its answer's finish reasons (the last call's)."""

    __slots__ = ("ex", "reasons", "tracer")

    def __init__(self, tracer: Tracer, ex: Exchange) -> None:
        self.tracer = tracer
        self.ex = ex
        self.reasons: list[str] = []


# Set while a request is handled; None (the default) means no span anywhere.
_HANDLING: ContextVar[_Handling | None] = ContextVar("agentproxy_tracing", default=None)


class Tracing:
    """The process's tracer provider: opened from `tracing:` at start, flushed at shutdown."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("agentproxy")

    @contextlib.contextmanager
    def request(self, ex: Exchange, headers: Mapping[str, str]) -> Iterator[Span]:
        """The request's span, current for everything the request does inside it; a child of
        the caller's trace when its `traceparent` header names one."""
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        operation = "chat"  # every route is a chat in GenAI terms (Chat, Messages, Responses)
        handling = _Handling(self.tracer, ex)
        name = f"{operation} {ex.alias}"
        with _opened(self.tracer, name, SpanKind.SERVER, None, extract(headers)) as span:
            token = _HANDLING.set(handling)
            try:
                yield span
            finally:
                _HANDLING.reset(token)
                if span.is_recording():
                    span.set_attributes(_request_attributes(ex, operation))
                    if handling.reasons:
                        span.set_attribute("gen_ai.response.finish_reasons", handling.reasons)

    def shutdown(self) -> None:
        """Send what is still queued (bounded by the exporter's timeout), then stop."""
        self.provider.shutdown()


def unavailable(settings: TracingSettings) -> str | None:
    """Why tracing, enabled, cannot start (the extra is missing); None when it can or is off."""
    if not settings.enabled:
        return None
    try:
        found = all(importlib.util.find_spec(name) is not None for name in _EXTRA_MODULES)
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    return None if found else EXTRA_MISSING


def open_tracing(
    settings: TracingSettings, environ: Mapping[str, str] = os.environ
) -> Tracing | None:
    """A Tracing when `tracing.enabled` (and OTEL_SDK_DISABLED is not true); None otherwise.
    What the YAML leaves unset, the SDK reads from the standard OTEL_* variables."""
    if not settings.enabled or environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
    except ImportError as missing:
        raise RuntimeError(EXTRA_MISSING) from missing
    attributes: dict[str, str] = {}
    if settings.service_name is not None:
        attributes[SERVICE_NAME] = settings.service_name
    elif not environ.get("OTEL_SERVICE_NAME"):
        attributes[SERVICE_NAME] = "agentproxy"
    sampler: Sampler | None = None  # the SDK's from OTEL_TRACES_SAMPLER(_ARG), else always on
    if settings.sample_ratio is not None or not environ.get(_SAMPLER_VARIABLE):
        ratio = 1.0 if settings.sample_ratio is None else settings.sample_ratio
        sampler = ParentBased(TraceIdRatioBased(ratio))
    provider = TracerProvider(resource=Resource.create(attributes), sampler=sampler)
    exporter = OTLPSpanExporter(endpoint=_traces_url(settings.endpoint))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    where = settings.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint"
    log.info("tracing: spans go to %s over OTLP/HTTP", where)
    return Tracing(provider)


def responded(span: Span, status: int) -> None:
    """The status the client got (an upstream's error answered as it was is one too)."""
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        from opentelemetry.trace import StatusCode

        span.set_status(StatusCode.ERROR, str(status))


def _traces_url(endpoint: str | None) -> str | None:
    """The YAML's endpoint is a base, as OTEL_EXPORTER_OTLP_ENDPOINT is: /v1/traces is added
    unless given. None leaves the exporter to the OTEL_EXPORTER_OTLP_* variables."""
    if endpoint is None:
        return None
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else f"{endpoint}/v1/traces"


def active() -> bool:
    """Whether the request being handled is traced (to skip building a span's attributes)."""
    return _HANDLING.get() is not None


def span(
    name: str, attributes: Mapping[str, Any] | None = None
) -> contextlib.AbstractContextManager[Span | None]:
    """A child span of the request being handled, or the shared no-op outside one."""
    handling = _HANDLING.get()
    if handling is None:
        return _OFF
    from opentelemetry.trace import SpanKind

    return _opened(handling.tracer, name, SpanKind.INTERNAL, attributes)


def call_span(ex: Exchange, attempt: int) -> contextlib.AbstractContextManager[Span | None]:
    """One upstream call, as a GenAI client span of the deployment it went to."""
    handling = _HANDLING.get()
    if handling is None:
        return _OFF
    from opentelemetry.trace import SpanKind

    deployment = ex.deployment
    assert deployment is not None
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": deployment.provider,
        "gen_ai.system": deployment.provider,  # the name before semconv 1.37
        "gen_ai.request.model": deployment.upstream_model,
        "agentproxy.model": ex.alias,
        "agentproxy.attempt": attempt,
    }
    return _opened(
        handling.tracer, f"chat {deployment.upstream_model}", SpanKind.CLIENT, attributes
    )


def replied(span: Span | None, ex: Exchange, data: Mapping[str, Any], usage: Usage | None) -> None:
    """A call's answer on its span: tokens, finish reasons, the model that answered."""
    if span is None or not span.is_recording():
        return
    span.set_attributes(_usage_attributes(usage))
    reasons = finish_reasons(data)
    handling = _HANDLING.get()
    if handling is not None and handling.ex is ex:  # the request's own answer, not a summary's
        handling.reasons = reasons
    if reasons:
        span.set_attribute("gen_ai.response.finish_reasons", reasons)
    model = data.get("model")
    if isinstance(model, str):
        span.set_attribute("gen_ai.response.model", model[:200])


@contextlib.contextmanager
def _opened(
    tracer: Tracer,
    name: str,
    kind: SpanKind,
    attributes: Mapping[str, Any] | None,
    parent: Context | None = None,
) -> Iterator[Span]:
    """A current span that says how it failed by the error's type only: an exception's text
    may quote what the upstream answered, which is no trace's business."""
    with tracer.start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as error:
            if span.is_recording():
                _failed(span, error_type(error))
            raise


def _failed(span: Span, kind: str) -> None:
    from opentelemetry.trace import StatusCode

    span.set_attribute("error.type", kind)
    span.set_status(StatusCode.ERROR, kind)


def error_type(error: BaseException) -> str:
    """A failure as a low-cardinality name: the upstream's HTTP status, the proxy's error
    code (`upstream_timeout`), `cancelled` when the client left, else the exception's class."""
    if isinstance(error, ProxyError):
        return error.code or error.type
    if isinstance(error, Failure):  # the other failure: the provider's (UpstreamHTTPError)
        return str(error.status)
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    return type(error).__qualname__


def finish_reasons(data: Mapping[str, Any]) -> list[str]:
    """Why the model stopped, in any of the three wire formats."""
    choices = data.get("choices")
    if isinstance(choices, list):
        return [
            c["finish_reason"]
            for c in choices
            if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)
        ]
    for field in ("stop_reason", "status"):  # Anthropic Messages; OpenAI Responses
        value = data.get(field)
        if isinstance(value, str):
            return [value]
    return []


def _usage_attributes(usage: Usage | None) -> dict[str, int]:
    if usage is None:
        return {}
    return {
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
        "agentproxy.usage.cache_read_tokens": usage.cache_read,
        "agentproxy.usage.cache_write_tokens": usage.cache_write,
    }


def _request_attributes(ex: Exchange, operation: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": ex.alias,
        "gen_ai.conversation.id": ex.identity.session_name,
        "agentproxy.request_id": ex.identity.request_id,
        "agentproxy.session": ex.identity.session_name,
        "agentproxy.policy": ex.policy.name,
        "agentproxy.wire": ex.client.wire,
        "agentproxy.stream": ex.client.stream,
        "agentproxy.rewrites": [f"{note.stage}.{note.action}" for note in ex.notes],
        "agentproxy.upstream_calls": ex.recovery.calls,
        **_usage_attributes(ex.accounting.usage),
    }
    if ex.deployment is not None:
        attributes["gen_ai.provider.name"] = ex.deployment.provider
    if ex.identity.key is not None:
        attributes["agentproxy.key"] = ex.identity.key.name  # the key's name, never its secret
    if ex.accounting.cost_usd is not None:
        attributes["agentproxy.cost_usd"] = ex.accounting.cost_usd
    return attributes
