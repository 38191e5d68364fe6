"""OpenTelemetry traces, as a collector receives them: a real proxy over sockets in front of
the simulator sends OTLP/HTTP (protobuf) to a receiver on 127.0.0.1, and the test reads back
the span tree (parents by id), the names and the attributes. With tracing off, nothing comes.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from proxy.policies.spec import TracingSettings
from proxy.sim.simulator import Fault, Simulator
from proxy.tracing import EXTRA_MISSING, finish_reasons, open_tracing, unavailable
from tests.conftest import ProxyFactory

SECRET = "sk-alice-0123456789abcdef"  # the client's key: must appear in no span
UPSTREAM_SECRET = "sk-upstream-9876543210"
LOG = "\n".join(
    f"2026-11-30 10:{i // 60:02d}:{i % 60:02d} INFO request {i} served in 12ms" for i in range(600)
).replace("request 417 served in 12ms", "ERROR E-4417 database connection refused")
READ_LOG = {"name": "read_file", "arguments": '{"path": "server.log"}'}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    status: int
    service: str


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver: every span it was sent, decoded."""

    spans: list[Span] = field(default_factory=list)
    posts: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        self.posts += 1
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        Span(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            status=span.status.code,
                            service=str(resource.get("service.name")),
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    async def request(self, count: int = 1, timeout_s: float = 10.0) -> list[Span]:
        """The request spans, once `count` came: spans are sent in batches from the SDK's
        thread, and a request's span ends (and goes out) last."""
        for _ in range(int(timeout_s / 0.05)):
            requests = [span for span in self.spans if span.kind == SERVER]
            if len(requests) >= count:
                return requests
            await asyncio.sleep(0.05)
        raise AssertionError(f"no request span: got {[s.name for s in self.spans]}")

    def named(self, name: str) -> list[Span]:
        return [span for span in self.spans if span.name == name]

    def children(self, parent: Span) -> list[Span]:
        return [span for span in self.spans if span.parent_id == parent.span_id]


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


# Span kinds and status codes as OTLP numbers them.
SERVER, CLIENT, INTERNAL = 2, 3, 1
STATUS_ERROR = 2


@pytest.fixture
async def receiver(aiohttp_server: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Receiver, str]:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # the SDK's own variable: send soon
    received = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", received.handle)
    server: TestServer = await aiohttp_server(app)
    return received, str(server.make_url("")).rstrip("/")


async def start(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim: Simulator,
    tracing: str,
    policy: str = "",
    window: int = 8192,
) -> TestServer:
    upstream: TestServer = await aiohttp_server(sim.app())
    url = str(upstream.make_url("")).rstrip("/")
    models = "".join(
        f"""
          - model_name: {alias}
            litellm_params: {{model: openai/{alias}, api_base: "{url}/v1",
                              api_key: {UPSTREAM_SECRET}}}
            model_info: {{max_input_tokens: {window}}}"""
        for alias in ("sim", "backup", "summ")
    )
    text = textwrap.dedent(
        f"""\
        store: {{path: {tmp_path / "state"}}}
        keys:
          api_keys: [{{name: alice, key: {SECRET}}}]
        model_list:{models}
        policies:
          - name: traced
            retry: {{base_s: 0.01, cap_s: 0.02}}
        """
    ) + textwrap.indent(textwrap.dedent(policy), "    ")
    path = tmp_path / "agentproxy.yaml"
    path.write_text(text + tracing)
    return await start_proxy(path)


async def chat(proxy: TestServer, messages: list[dict[str, Any]], **headers: str) -> Any:
    body = {"model": "sim", "messages": messages, "tools": TOOLS}
    headers = {"authorization": f"Bearer {SECRET}", "x-agentproxy-session": "task-7", **headers}
    async with aiohttp.ClientSession() as http:
        url = proxy.make_url("/v1/chat/completions")
        async with http.post(url, json=body, headers=headers) as response:
            assert response.status == 200, await response.text()
            return await response.json()


def log_then_recall() -> list[dict[str, Any]]:
    """A history whose 600-line tool result the proxy offloads, and a question the model
    answers by calling the proxy's recall tool."""
    call = {"id": "c1", "type": "function", "function": READ_LOG}
    return [
        {"role": "user", "content": "Check the server log."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": LOG},
        {
            "role": "user",
            "content": 'Which error was logged? agentproxy_recall({"query": "ERROR"})',
        },
    ]


def enabled(endpoint: str) -> str:
    return f"tracing: {{enabled: true, endpoint: {endpoint}, service_name: proxy-under-test}}\n"


async def test_a_retried_request_with_a_recall_round_is_one_trace(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    receiver: tuple[Receiver, str],
) -> None:
    received, endpoint = receiver
    sim = Simulator()
    offload = "offload: {min_tokens: 500}\n"
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, enabled(endpoint), offload)
    sim.inject(Fault(status=503))
    answer = await chat(proxy, log_then_recall())
    assert "E-4417" in answer["choices"][0]["message"]["content"]  # recalled, then quoted
    [request] = await received.request()
    assert request.name == "chat sim" and request.parent_id == ""
    assert request.service == "proxy-under-test"
    assert {span.trace_id for span in received.spans} == {request.trace_id}
    top = received.children(request)
    calls = [span for span in top if span.kind == CLIENT]
    # The 503, then its retry (the one whose answer called recall); the round's call below it.
    assert [c.attributes["agentproxy.attempt"] for c in calls] == [1, 2]
    assert calls[0].attributes["error.type"] == "503" and calls[0].status == STATUS_ERROR
    assert calls[1].attributes["gen_ai.response.finish_reasons"] == ["tool_calls"]
    for call in calls:
        assert call.name == "chat sim"
        assert call.attributes["gen_ai.provider.name"] == "openai"
        assert call.attributes["gen_ai.request.model"] == "sim"
    [recall] = [span for span in top if span.name == "agentproxy.recall"]
    assert recall.attributes == {"agentproxy.recall.round": 1, "agentproxy.recall.calls": 1}
    [after_recall] = received.children(recall)
    assert after_recall.kind == CLIENT and after_recall.attributes["agentproxy.attempt"] == 3
    assert after_recall.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert after_recall.attributes["gen_ai.usage.input_tokens"] > 0
    # The offloaded log went to the store: its write is a child of the request.
    writes = [span for span in top if span.name == "agentproxy.store.write"]
    assert "put" in {w.attributes["agentproxy.store.operation"] for w in writes}

    attributes = request.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "sim"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert attributes["agentproxy.session"] == attributes["gen_ai.conversation.id"] == "task-7"
    assert attributes["agentproxy.policy"] == "traced"
    assert attributes["agentproxy.key"] == "alice"
    assert attributes["agentproxy.upstream_calls"] == 3
    assert "offload.offloaded" in attributes["agentproxy.rewrites"]
    assert "retry.retried" in attributes["agentproxy.rewrites"]
    assert "recall.answered" in attributes["agentproxy.rewrites"]
    input_tokens = attributes["gen_ai.usage.input_tokens"]
    assert input_tokens == sum(
        c.attributes["gen_ai.usage.input_tokens"] for c in [*calls[1:], after_recall]
    )
    assert attributes["http.response.status_code"] == 200
    # Names and numbers only: no key, no upstream key, no word of the conversation.
    everything = repr([(s.name, s.attributes) for s in received.spans])
    for secret in (SECRET, UPSTREAM_SECRET, "E-4417", "Check the server log", "database"):
        assert secret not in everything


async def test_a_summary_and_a_fallback_are_spans_with_their_calls_below(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    receiver: tuple[Receiver, str],
) -> None:
    received, endpoint = receiver
    sim = Simulator(context_window=4_000)
    policy = """\
        compaction: {summarizer_model: summ}
        fallbacks: [{from: sim, to: [backup]}]
    """
    proxy = await start(
        aiohttp_server, start_proxy, tmp_path, sim, enabled(endpoint), policy, window=4_000
    )
    sim.inject(Fault(status=503, times=100, model="sim"))
    await chat(proxy, long_task())
    [request] = await received.request()
    top = {span.name: span for span in received.children(request)}
    [summary_call] = received.children(top["agentproxy.summary"])
    assert summary_call.name == "chat summ" and summary_call.kind == CLIENT
    assert summary_call.attributes["gen_ai.usage.output_tokens"] > 0
    failed = [s for s in received.children(request) if s.kind == CLIENT]
    assert len(failed) == 3  # the policy's attempts at `sim`, each a 503
    assert all(s.attributes["error.type"] == "503" for s in failed)
    fallback = top["agentproxy.fallback"]
    assert fallback.attributes == {
        "agentproxy.from": "sim",
        "agentproxy.to": "backup",
        "agentproxy.reason": "transient",
    }
    [answered] = received.children(fallback)
    assert answered.name == "chat backup" and "error.type" not in answered.attributes
    assert "compaction.summarized" in request.attributes["agentproxy.rewrites"]


async def test_the_callers_trace_context_is_the_request_spans_parent(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    receiver: tuple[Receiver, str],
) -> None:
    received, endpoint = receiver
    proxy = await start(aiohttp_server, start_proxy, tmp_path, Simulator(), enabled(endpoint))
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    traceparent = f"00-{trace_id}-{parent_id}-01"
    await chat(proxy, [{"role": "user", "content": "hi"}], traceparent=traceparent)
    [request] = await received.request()
    assert (request.trace_id, request.parent_id) == (trace_id, parent_id)


async def test_with_tracing_off_nothing_is_sent(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    receiver: tuple[Receiver, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    received, endpoint = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)  # set, but tracing is off
    sim = Simulator()
    for tracing in ("", "tracing: {enabled: false, endpoint: " + endpoint + "}\n"):
        proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, tracing)
        sim.inject(Fault(status=503))
        await chat(proxy, [{"role": "user", "content": "hi"}])
        await proxy.close()  # shut down: anything queued would have been sent now
    await asyncio.sleep(0.3)
    assert received.posts == 0 and received.spans == []


async def test_the_otel_variables_fill_in_what_the_yaml_leaves_unset(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    receiver: tuple[Receiver, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    received, endpoint = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-the-environment")
    sim = Simulator()
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, "tracing: {enabled: true}\n")
    await chat(proxy, [{"role": "user", "content": "hi"}])
    await received.request()
    assert {span.service for span in received.spans} == {"from-the-environment"}


def test_sampling_and_the_sdk_switch() -> None:
    never = open_tracing(TracingSettings(enabled=True, sample_ratio=0.0), environ={})
    assert never is not None
    with never.tracer.start_as_current_span("x") as span:
        assert not span.is_recording()
    never.shutdown()
    off = {"OTEL_SDK_DISABLED": "true"}
    assert open_tracing(TracingSettings(enabled=True), environ=off) is None
    assert open_tracing(TracingSettings(), environ={}) is None


def test_finish_reasons_in_each_wire_format() -> None:
    assert finish_reasons({"choices": [{"finish_reason": "length"}]}) == ["length"]
    assert finish_reasons({"stop_reason": "end_turn"}) == ["end_turn"]
    assert finish_reasons({"status": "completed"}) == ["completed"]
    assert finish_reasons({}) == []


def long_task(steps: int = 12) -> list[dict[str, Any]]:
    """~4,500 tokens of agent history: over a 4,000-token window, so the proxy summarizes."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Port the parser to Rust."}]
    for i in range(steps):
        function = {"name": "read_file", "arguments": f'{{"path": "src/m{i}.py"}}'}
        call = {"id": f"c{i}", "type": "function", "function": function}
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": f"c{i}", "content": "x = 1\n" * 230})
    history.append({"role": "user", "content": "Go on with the next module."})
    return history


async def test_a_streamed_request_is_traced_to_its_end(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    receiver: tuple[Receiver, str],
) -> None:
    received, endpoint = receiver
    sim = Simulator()
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, enabled(endpoint))
    sim.inject(Fault(status=503))
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with aiohttp.ClientSession() as http:
        url = proxy.make_url("/v1/chat/completions")
        headers = {"authorization": f"Bearer {SECRET}"}
        async with http.post(url, json=body, headers=headers) as response:
            assert response.status == 200 and b"[DONE]" in await response.read()
    [request] = await received.request()
    calls = received.children(request)
    assert [(c.name, c.attributes.get("error.type")) for c in calls] == [
        ("chat sim", "503"),
        ("chat sim", None),
    ]
    assert request.attributes["agentproxy.stream"] is True
    assert request.attributes["gen_ai.usage.output_tokens"] > 0  # counted as the stream ended


def test_without_the_extra_enabled_tracing_is_refused_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert unavailable(TracingSettings(enabled=True)) is None  # installed here
    assert unavailable(TracingSettings()) is None
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http", None)
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    assert unavailable(TracingSettings(enabled=True)) == EXTRA_MISSING
    assert unavailable(TracingSettings()) is None  # off: nothing needed
    with pytest.raises(RuntimeError, match=r"pip install 'agentproxy\[otel\]'"):
        open_tracing(TracingSettings(enabled=True), environ={})
