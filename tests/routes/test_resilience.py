"""Retries, fallbacks and circuit breakers through the real proxy, over real sockets, against
the simulator's fault injection, streaming and not."""

from __future__ import annotations

import asyncio
import re
import textwrap
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Fault, Simulator
from proxy.state import EVENTS
from tests.conftest import ProxyFactory, base_url

FAST = "retry: {base_s: 0.01, cap_s: 0.05}"  # quick backoff: these tests count, not wait
HI = [{"role": "user", "content": "hi"}]


class Proxy:
    """A proxy serving aliases from simulators, and a raw HTTP client for it."""

    def __init__(self, server: TestServer, http: aiohttp.ClientSession) -> None:
        self.server = server
        self.http = http

    @property
    def url(self) -> str:
        return base_url(self.server)

    async def chat(
        self, stream: bool = False, model: str = "sim", messages: Any = None, **headers: str
    ) -> tuple[int, dict[str, str], Any]:
        """(status, headers, JSON body or the streamed text) of one request."""
        body = {"model": model, "messages": messages or HI, "stream": stream}
        async with self.http.post(
            self.url + "/chat/completions", json=body, headers=headers
        ) as response:
            raw = await response.read()
            got = {name.lower(): value for name, value in response.headers.items()}
        if response.status == 200 and stream:
            return response.status, got, _streamed_text(raw)
        return response.status, got, orjson.loads(raw)

    async def metric(self, name: str, **labels: str) -> float:
        async with self.http.get(str(self.server.make_url("/metrics"))) as response:
            text = await response.text()
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
            if match and ",".join(sorted(match.group(1).split(","))) == wanted:
                return float(match.group(2))
        return 0.0

    async def admin(self) -> Any:
        async with self.http.get(str(self.server.make_url("/admin/policies"))) as response:
            return await response.json()


def _streamed_text(raw: bytes) -> str:
    text = ""
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            event = orjson.loads(line[6:])
            if "error" in event:
                return f"ERROR: {event['error']['message']}"
            for choice in event.get("choices") or []:
                text += choice.get("delta", {}).get("content") or ""
    return text


@pytest.fixture
async def serve(aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path) -> Any:
    """serve({alias: (simulator, window)}, policy) -> Proxy; the policy applies to every alias."""
    sessions: list[aiohttp.ClientSession] = []

    async def start(upstreams: dict[str, tuple[Simulator, int]], policy: str = "") -> Proxy:
        models = ""
        for alias, (sim, window) in upstreams.items():
            server = await aiohttp_server(sim.app())
            models += f"""
              - model_name: {alias}
                litellm_params:
                  model: openai/{alias}
                  api_base: {str(server.make_url("")).rstrip("/")}/v1
                model_info:
                  max_input_tokens: {window}"""
        text = textwrap.dedent(
            f"""\
            store: {{path: {tmp_path / "state"}}}
            model_list:{models}
            policies:
              - name: resilient
            """
        ) + textwrap.indent(textwrap.dedent(policy), "    ")
        path = tmp_path / "c.yaml"
        path.write_text(text)
        http = aiohttp.ClientSession()
        sessions.append(http)
        return Proxy(await start_proxy(path), http)

    yield start
    for http in sessions:
        await http.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_429_with_retry_after_waits_at_least_that_long_then_succeeds(
    serve: Any, stream: bool
) -> None:
    sim = Simulator()
    proxy = await serve({"sim": (sim, 8192)})
    sim.inject(Fault(status=429, retry_after=1))
    started = time.monotonic()
    status, headers, body = await proxy.chat(stream)
    assert status == 200
    assert time.monotonic() - started >= 1.0
    assert len(sim.requests) == 2 and sim.requests[1].at - sim.requests[0].at >= 1.0
    assert (body if stream else body["choices"][0]["message"]["content"]) == "You said: hi"
    assert "retry.retried;count=1" in headers["x-agentproxy-applied"]


@pytest.mark.parametrize("stream", [False, True])
async def test_503_twice_then_success_is_three_upstream_calls(serve: Any, stream: bool) -> None:
    sim = Simulator()
    proxy = await serve({"sim": (sim, 8192)}, FAST)
    sim.inject(Fault(status=503, times=2))
    status, _, _ = await proxy.chat(stream)
    assert status == 200 and len(sim.requests) == 3
    assert await proxy.metric("agentproxy_retries_total", model="sim", error_class="transient") == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_400_is_not_retried_and_passes_through_unchanged(serve: Any, stream: bool) -> None:
    sim = Simulator()
    proxy = await serve({"sim": (sim, 8192)}, FAST)
    said = {"error": {"message": "bad request", "type": "invalid_request_error", "code": "x"}}
    sim.inject(Fault(status=400, body=said))
    status, headers, body = await proxy.chat(stream)
    assert (status, body) == (400, said)
    assert headers["x-should-retry"] == "false"
    assert len(sim.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_persistent_503_is_answered_by_the_fallback(serve: Any, stream: bool) -> None:
    sim = Simulator()
    policy = f"""
        {FAST}
        fallbacks: [{{from: sim, to: [backup]}}]
    """
    proxy = await serve({"sim": (sim, 8192), "backup": (sim, 8192)}, policy)
    sim.inject(Fault(status=503, times=100, model="sim"))
    status, headers, body = await proxy.chat(stream)
    assert status == 200
    assert (body if stream else body["choices"][0]["message"]["content"]) == "You said: hi"
    assert headers["x-agentproxy-model"] == "backup"
    assert "fallback.fell_back" in headers["x-agentproxy-applied"]
    assert [r.body["model"] for r in sim.requests] == ["sim", "sim", "sim", "backup"]
    labels = {"from_model": "sim", "to_model": "backup", "reason": "transient"}
    assert await proxy.metric("agentproxy_fallbacks_total", **labels) == 1
    # Requests are counted under the alias the client asked for.
    requested = {"route": "/v1/chat/completions", "model": "sim", "status": "200"}
    assert await proxy.metric("agentproxy_requests_total", **requested) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_overflow_is_answered_by_a_larger_window_fallback(serve: Any, stream: bool) -> None:
    small, large = Simulator(context_window=1000), Simulator(context_window=32_000)
    policy = "fallbacks: [{from: small, to: [large], when: [overflow]}]"
    proxy = await serve({"small": (small, 1000), "large": (large, 32_000)}, policy)
    # One long question: nothing older to summarize, so compaction cannot make it fit.
    question = "Please review this log. " + "line of log output, nothing odd here. " * 300
    status, headers, body = await proxy.chat(
        stream, model="small", messages=[{"role": "user", "content": question}]
    )
    assert status == 200, body
    assert headers["x-agentproxy-model"] == "large"
    assert small.request_count >= 1 and len(large.requests) == 1
    assert large.requests[0].body["messages"][-1]["content"] == question  # the whole of it
    text = body if stream else body["choices"][0]["message"]["content"]
    assert text.startswith("You said: Please review this log.")


async def test_circuit_opens_after_failures_and_closes_after_a_probe(serve: Any) -> None:
    sim = Simulator()
    policy = """
        retry: {attempts: 1}
        circuit: {failures: 2, cooldown_s: 0.3}
    """
    proxy = await serve({"sim": (sim, 8192)}, policy)
    sim.inject(Fault(status=503, times=2))
    for _ in range(2):
        status, _, _ = await proxy.chat()
        assert status == 503
    status, headers, body = await proxy.chat()
    assert status == 503 and body["error"]["code"] == "circuit_open"
    assert "cooling down after 2 consecutive failures" in body["error"]["message"]
    assert headers["x-should-retry"] == "false" and headers["retry-after"] == "1"
    assert len(sim.requests) == 2  # no upstream call while open
    assert await proxy.metric("agentproxy_circuit_state", deployment="sim#0") == 2
    assert (await proxy.admin())["circuits"]["deployments"]["sim#0"]["state"] == "open"
    await asyncio.sleep(0.35)
    status, _, _ = await proxy.chat()  # the probe
    assert status == 200 and len(sim.requests) == 3
    assert await proxy.metric("agentproxy_circuit_state", deployment="sim#0") == 0
    transitions = "agentproxy_circuit_transitions_total"
    for state in ("open", "half_open", "closed"):
        assert await proxy.metric(transitions, deployment="sim#0", state=state) == 1


@pytest.mark.parametrize("fault", [Fault(status=503, times=3), Fault(status=429, times=3)])
async def test_the_openai_sdk_makes_one_request_when_told_not_to_retry(
    serve: Any, fault: Fault
) -> None:
    sim = Simulator()
    proxy = await serve({"sim": (sim, 8192)}, FAST)
    sim.inject(fault)
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="unused")  # max_retries=2
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model="sim", messages=HI)  # type: ignore[arg-type]
    assert caught.value.status_code == fault.status
    assert caught.value.response.headers["x-should-retry"] == "false"
    labels = {"route": "/v1/chat/completions", "model": "sim", "status": str(fault.status)}
    assert await proxy.metric("agentproxy_requests_total", **labels) == 1  # one SDK request
    assert len(sim.requests) == 3  # the proxy's three attempts, nobody else's


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_hits_prove_one_retry_loop(serve: Any, stream: bool) -> None:
    sim = Simulator()
    proxy = await serve({"sim": (sim, 8192)}, "retry: {attempts: 3, base_s: 0.01}")
    sim.inject(Fault(status=503, times=100))
    status, headers, body = await proxy.chat(stream)
    assert status == 503 and len(sim.requests) == 3
    error = body["error"]
    assert error["class"] == "transient" and error["attempts"] == 3
    assert error["upstream_status"] == 503 and error["recoveries"] == ["retry x2"]
    assert error["request_id"] == headers["x-request-id"]
    assert "raise retry.attempts" in error["guidance"]
    assert "message" in error and "type" in error  # the provider's own fields are kept


async def test_the_error_body_tells_every_recovery_tried(serve: Any) -> None:
    sim = Simulator()
    policy = f"""
        {FAST}
        fallbacks: [{{from: sim, to: [backup]}}]
    """
    proxy = await serve({"sim": (sim, 8192), "backup": (sim, 8192)}, policy)
    sim.inject(Fault(reset=True, times=100))
    status, headers, body = await proxy.chat()
    assert status == 502 and headers["x-should-retry"] == "false"
    assert headers["x-agentproxy-model"] == "backup"  # the last one tried
    error = body["error"]
    assert error["code"] == "upstream_unreachable" and error["class"] == "transient"
    assert error["attempts"] == 6 and error["upstream_status"] is None
    assert error["recoveries"] == ["retry x2", "fallback to backup", "retry x2"]
    assert len(sim.requests) == 6


async def test_reset_mid_stream_is_an_error_event_and_no_retry(serve: Any) -> None:
    sim = Simulator()
    proxy = await serve({"sim": (sim, 8192)}, FAST)
    sim.inject(Fault(cut_after_chunks=2))
    status, _, text = await proxy.chat(True, messages=[{"role": "user", "content": "a b c d e"}])
    assert status == 200 and text.startswith("ERROR: ")
    assert len(sim.requests) == 1


async def test_a_stream_cut_after_it_began_counts_as_a_failed_request(
    serve: Any, tmp_path: Path
) -> None:
    """The client saw a 200 and then an error event: metrics, the session circuit and the
    event log all count a failure, never a success."""
    sim = Simulator()
    policy = """
        retry: {attempts: 1}
        circuit: {session_failures: 2}
    """
    proxy = await serve({"sim": (sim, 8192)}, policy)
    sim.inject(Fault(cut_after_chunks=2, times=2))
    session = {"x-agentproxy-session": "cut-twice"}
    words = [{"role": "user", "content": "a b c d e"}]
    for _ in range(2):
        status, _, text = await proxy.chat(True, messages=words, **session)
        assert status == 200 and text.startswith("ERROR: ")
    route = {"route": "/v1/chat/completions", "model": "sim"}
    assert await proxy.metric("agentproxy_requests_total", **route, status="200") == 0
    assert await proxy.metric("agentproxy_requests_total", **route, status="502") == 2
    status, _, body = await proxy.chat(True, messages=words, **session)
    assert status == 429 and body["error"]["code"] == "session_circuit_open"
    proxy.server.app[EVENTS].flush()
    events = [orjson.loads(line) for line in (tmp_path / "state" / "events.jsonl").open()]
    failed = [e for e in events if (e["stage"], e["action"]) == ("stream", "failed")]
    assert len(failed) == 2 and failed[0]["status"] == 502 and failed[0]["session"] == "cut-twice"


async def test_a_session_failing_the_same_way_is_stopped_until_it_changes(serve: Any) -> None:
    sim = Simulator()
    policy = """
        retry: {attempts: 1}
        circuit: {session_failures: 2}
    """
    proxy = await serve({"sim": (sim, 8192)}, policy)
    sim.inject(Fault(status=400, times=2))
    session = {"x-agentproxy-session": "agent-7"}
    for _ in range(2):
        status, _, _ = await proxy.chat(**session)
        assert status == 400
    status, headers, body = await proxy.chat(**session)
    assert status == 429 and body["error"]["code"] == "session_circuit_open"
    assert headers["x-should-retry"] == "false" and body["error"]["upstream_status"] == 400
    assert len(sim.requests) == 2
    changed = [*HI, {"role": "assistant", "content": "?"}, {"role": "user", "content": "again"}]
    status, _, _ = await proxy.chat(messages=changed, **session)
    assert status == 200
    status, _, _ = await proxy.chat(**session)  # closed again by the success
    assert status == 200


async def test_the_deadline_bounds_retries_and_names_its_setting(serve: Any) -> None:
    sim = Simulator()
    proxy = await serve({"sim": (sim, 8192)}, "retry: {deadline_s: 0.4, base_s: 0.01}")
    sim.inject(Fault(delay_s=5, times=3))
    started = time.monotonic()
    status, headers, body = await proxy.chat()
    assert time.monotonic() - started < 1.5
    assert status == 504 and "retry.deadline_s (0.4s)" in body["error"]["message"]
    assert headers["x-should-retry"] == "false"


async def test_a_slow_attempt_is_cut_and_retried(serve: Any) -> None:
    sim = Simulator()
    proxy = await serve({"sim": (sim, 8192)}, "retry: {attempt_timeout_s: 0.2, base_s: 0.01}")
    sim.inject(Fault(delay_s=5))
    started = time.monotonic()
    status, _, _ = await proxy.chat()
    assert status == 200 and time.monotonic() - started < 1.5
    assert len(sim.requests) == 2
