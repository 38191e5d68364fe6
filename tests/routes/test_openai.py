"""The OpenAI surface, driven by the real openai SDK over real sockets."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.request_id import is_uuid
from proxy.sim.simulator import Fault, Simulator
from tests.conftest import SimProxyFactory, base_url

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


def client(proxy: TestServer, **options: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused", **options)


async def test_async_sdk_non_streaming(proxy: TestServer, sim: Simulator) -> None:
    reply = await client(proxy).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "hello there"}]
    )
    assert reply.choices[0].message.content == "You said: hello there"
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    # The upstream got the provider's model name and the provider key, never the alias.
    assert sim.requests[-1].body["model"] == "sim"
    assert sim.requests[-1].headers["Authorization"] == "Bearer sk-sim-upstream-secret"


async def test_async_sdk_streaming_with_tool_calls(proxy: TestServer) -> None:
    stream = await client(proxy).chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": 'please read_file({"path": "notes.txt"})'}],
        tools=TOOLS,  # type: ignore[arg-type]
        stream=True,
    )
    names, arguments, usage = [], "", []
    async for chunk in stream:
        usage.append(chunk.usage)
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                if call.function and call.function.name:
                    names.append(call.function.name)
                if call.function and call.function.arguments:
                    arguments += call.function.arguments
    assert names == ["read_file"]
    assert arguments == '{"path": "notes.txt"}' or arguments == '{"path":"notes.txt"}'
    # The client did not ask for usage: the chunk the proxy asked for is not shown.
    assert all(u is None for u in usage)


async def test_streaming_usage_kept_when_client_asks(proxy: TestServer) -> None:
    stream = await client(proxy).chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "count my tokens"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert chunks[-1].choices == []


async def test_sync_sdk_streaming_and_not(proxy: TestServer) -> None:
    def run() -> tuple[str | None, str]:
        sync = openai.OpenAI(base_url=base_url(proxy), api_key="unused")
        reply = sync.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "sync call"}]
        )
        parts = [
            chunk.choices[0].delta.content or ""
            for chunk in sync.chat.completions.create(
                model="sim", messages=[{"role": "user", "content": "sync stream"}], stream=True
            )
            if chunk.choices
        ]
        return reply.choices[0].message.content, "".join(parts)

    content, streamed = await asyncio.to_thread(run)
    assert content == "You said: sync call"
    assert streamed == "You said: sync stream"


async def test_unknown_fields_pass_through_untouched(proxy: TestServer, sim: Simulator) -> None:
    await client(proxy).chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"vendor_knob": {"depth": 3}, "seed": 7},
    )
    sent = sim.requests[-1].body
    assert sent["vendor_knob"] == {"depth": 3}
    assert sent["seed"] == 7


async def test_first_chunk_arrives_before_upstream_finishes(proxy_for: SimProxyFactory) -> None:
    proxy = await proxy_for(Simulator(chunk_delay_s=0.15))
    started = time.perf_counter()
    stream = await client(proxy).chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "one two three four five six"}],
        stream=True,
    )
    arrivals = [time.perf_counter() - started async for _ in stream]
    # Nine words at 0.15 s each: the first chunk (the role chunk, held with the first word while
    # the stream's start is checked) must not wait for the last.
    assert arrivals[0] < arrivals[-1] / 2
    assert arrivals[-1] - arrivals[0] > 0.8


async def test_request_id_is_echoed_or_created(proxy: TestServer) -> None:
    async with aiohttp.ClientSession() as http:
        url = base_url(proxy) + "/chat/completions"
        body = {"model": "sim", "messages": [{"role": "user", "content": "x"}]}
        async with http.post(url, json=body, headers={"x-request-id": "trace-42"}) as r:
            assert r.headers["x-request-id"] == "trace-42"
            assert r.headers["x-agentproxy-model"] == "sim"
            assert "proxy;dur=" in r.headers["server-timing"]
        async with http.post(url, json=body) as r:
            assert is_uuid(r.headers["x-request-id"])


async def test_upstream_4xx_body_passes_through_unchanged(
    proxy: TestServer, sim: Simulator
) -> None:
    sim.inject(
        Fault(status=422, body={"error": {"message": "nope", "type": "x", "code": "custom"}})
    )
    async with aiohttp.ClientSession() as http:
        body = {"model": "sim", "messages": [{"role": "user", "content": "x"}]}
        async with http.post(base_url(proxy) + "/chat/completions", json=body) as r:
            assert r.status == 422
            assert await r.json() == {"error": {"message": "nope", "type": "x", "code": "custom"}}


async def test_upstream_echoing_the_provider_key_is_redacted(
    proxy: TestServer, sim: Simulator
) -> None:
    sim.inject(Fault(status=401, body={"error": {"message": "bad key sk-sim-upstream-secret"}}))
    async with aiohttp.ClientSession() as http:
        body = {"model": "sim", "messages": [{"role": "user", "content": "x"}]}
        async with http.post(base_url(proxy) + "/chat/completions", json=body) as r:
            text = await r.text()
    assert r.status == 401
    assert "sk-sim-upstream-secret" not in text and "[redacted]" in text


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [
        # Every attempt fails (3 by default): one failure would be retried.
        (Fault(reset=True, times=3), 502, "upstream_unreachable"),
        (Fault(malformed=True, times=3), 502, "upstream_bad_response"),
        (Fault(status=503, body="<html>busy</html>", times=3), 503, "upstream_http_error"),
    ],
)
async def test_upstream_failures_are_clear_errors(
    proxy: TestServer, sim: Simulator, fault: Fault, status: int, code: str
) -> None:
    sim.inject(fault)
    with pytest.raises(openai.APIStatusError) as caught:
        await client(proxy, max_retries=0).chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.status_code == status
    assert caught.value.body["code"] == code  # type: ignore[index]
    # ...and the proxy keeps serving.
    reply = await client(proxy).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "again"}]
    )
    assert reply.choices[0].message.content == "You said: again"


async def test_upstream_timeout_is_504_naming_the_setting(
    start_proxy: Any, tmp_path: Any, sim_server: TestServer, sim: Simulator
) -> None:
    from tests.conftest import sim_config

    path = tmp_path / "c.yaml"
    text = sim_config(str(sim_server.make_url("")).rstrip("/"))
    path.write_text(text.replace("api_key: sk", "timeout: 0.3\n      api_key: sk"))
    proxy = await start_proxy(path)
    sim.inject(Fault(delay_s=2, times=3))
    with pytest.raises(openai.APIStatusError) as caught:
        await client(proxy, max_retries=0).chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.status_code == 504
    assert "litellm_params.timeout of 'sim'" in caught.value.message


async def test_upstream_unreachable_is_502(start_proxy: Any, tmp_path: Any) -> None:
    from tests.conftest import sim_config

    path = tmp_path / "c.yaml"
    path.write_text(sim_config("http://127.0.0.1:9"))  # discard port: nothing listens
    proxy = await start_proxy(path)
    with pytest.raises(openai.APIStatusError) as caught:
        await client(proxy, max_retries=0).chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.status_code == 502
    assert "unreachable" in caught.value.message


async def test_stream_cut_midway_ends_with_error_event(proxy: TestServer, sim: Simulator) -> None:
    sim.inject(Fault(cut_after_chunks=2))
    stream = await client(proxy, max_retries=0).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "a b c d e f g"}], stream=True
    )
    received = []
    with pytest.raises(openai.APIError) as caught:
        async for chunk in stream:
            received.append(chunk)
    assert received, "chunks before the cut reached the client"
    assert "upstream" in str(caught.value.message)


async def test_models_lists_configured_aliases(proxy: TestServer) -> None:
    models = await client(proxy).models.list()
    assert [m.id for m in models.data] == ["sim"]


async def test_stream_error_status_before_first_byte_is_a_plain_error(
    proxy: TestServer, sim: Simulator
) -> None:
    # Longer than retry.retry_after_cap_s (60 s): not retried, passed on with its Retry-After.
    sim.inject(Fault(status=503, retry_after=120))
    with pytest.raises(openai.APIStatusError) as caught:
        await client(proxy, max_retries=0).chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "x"}], stream=True
        )
    assert caught.value.status_code == 503
    assert caught.value.response.headers["retry-after"] == "120"
    assert len(sim.requests) == 1


async def test_a_garbled_stream_start_is_retried(proxy: TestServer, sim: Simulator) -> None:
    """Garbage right after the first event: nothing reached the client yet, so the call is
    retried like any other failed call."""
    sim.inject(Fault(malformed=True))
    raw = await client(proxy, max_retries=0).chat.completions.with_raw_response.create(
        model="sim", messages=[{"role": "user", "content": "a b c"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
    assert text == "You said: a b c"
    assert raw.headers["x-agentproxy-applied"] == "retry.retried;count=1"
    assert len(sim.requests) == 2


async def test_garbled_stream_on_every_attempt_is_a_clear_error(
    proxy: TestServer, sim: Simulator
) -> None:
    sim.inject(Fault(malformed=True, times=3))
    with pytest.raises(openai.APIStatusError) as caught:
        await client(proxy, max_retries=0).chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "a b c"}], stream=True
        )
    assert caught.value.status_code == 502 and "not a JSON object" in caught.value.message
    assert len(sim.requests) == 3


async def test_client_leaving_mid_stream_is_counted_and_serving_goes_on(
    proxy_for: SimProxyFactory,
) -> None:
    proxy = await proxy_for(Simulator(chunk_delay_s=0.05))
    words = " ".join(["word"] * 40)
    async with aiohttp.ClientSession() as http:
        body = {"model": "sim", "messages": [{"role": "user", "content": words}], "stream": True}
        response = await http.post(base_url(proxy) + "/chat/completions", json=body)
        await response.content.readline()
        response.close()  # hang up after the first event
        for _ in range(100):
            await asyncio.sleep(0.05)
            async with http.get(str(proxy.make_url("/metrics"))) as r:
                if 'status="499"' in await r.text():
                    break
        else:
            raise AssertionError("the abandoned stream was not counted as 499")
        async with http.get(str(proxy.make_url("/metrics"))) as r:
            assert "agentproxy_requests_in_flight 1.0" in await r.text()  # just this one
    reply = await client(proxy).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "still fine"}]
    )
    assert reply.choices[0].message.content == "You said: still fine"
