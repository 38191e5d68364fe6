"""Time to first token, through the real proxy over real sockets on each wire: a stream is
observed from the request's arrival to the first piece of the answer — not to the opening event
the upstream sends at once, nor to the stream's end — and a whole answer is not observed."""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory

DELAY_S = 0.05  # between the simulator's events: the first piece comes after one or more
KEY = "sk-sim-upstream-secret"


async def start(start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer) -> TestServer:
    url = str(upstream.make_url("")).rstrip("/")
    path = tmp_path / "ttft.yaml"
    models = "".join(
        f"""
          - model_name: {alias}
            litellm_params: {{model: {model}, api_base: "{url}{base}", api_key: {KEY}}}"""
        for alias, model, base in (
            ("chat", "openai/sim", "/v1"),
            ("claude", "anthropic/claude-sim", ""),
        )
    )
    path.write_text(textwrap.dedent(f"store: {{path: {tmp_path}}}\nmodel_list:{models}\n"))
    return await start_proxy(path)


REQUESTS = {
    "chat": ("/v1/chat/completions", {"model": "chat"}),
    "anthropic": ("/v1/messages", {"model": "claude", "max_tokens": 200}),
    "responses": ("/v1/responses", {"model": "chat"}),
}


def body_for(wire: str, stream: bool) -> dict[str, Any]:
    _, body = REQUESTS[wire]
    text = "Tell me about the parser, in a few words please."
    if wire == "responses":
        return body | {"input": text, "stream": stream}
    return body | {"messages": [{"role": "user", "content": text}], "stream": stream}


async def observed(proxy: TestServer, model: str) -> tuple[float, float]:
    """(count, sum) of the time-to-first-token histogram for `model`."""
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url("/metrics")) as response:
            text = await response.text()
    values = []
    for suffix in ("count", "sum"):
        name = f"agentproxy_time_to_first_token_seconds_{suffix}"
        found = re.search(rf'^{name}\{{model="{model}"\}} (\S+)$', text, re.M)
        values.append(float(found.group(1)) if found else 0.0)
    return values[0], values[1]


@pytest.mark.parametrize("wire", sorted(REQUESTS))
async def test_a_stream_is_timed_to_its_first_token(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, wire: str
) -> None:
    sim = Simulator(api_key=KEY, chunk_delay_s=DELAY_S)
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()))
    path, _ = REQUESTS[wire]
    model = "claude" if wire == "anthropic" else "chat"
    headers = {"x-api-key": KEY, "authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            proxy.make_url(path), json=body_for(wire, stream=False), headers=headers
        ) as response:
            assert response.status == 200, await response.text()
        assert await observed(proxy, model) == (0, 0)  # a whole answer has no first token
        started = time.perf_counter()
        async with http.post(
            proxy.make_url(path), json=body_for(wire, stream=True), headers=headers
        ) as response:
            assert response.status == 200
            await response.read()
        whole = time.perf_counter() - started
    count, first = await observed(proxy, model)
    assert count == 1
    # The opening event(s) came at once, the first piece one delay later at least, and the
    # rest of the answer (several more pieces, each a delay apart) after it.
    assert DELAY_S <= first < whole - 2 * DELAY_S


STREAM_END = {"anthropic": "message_stop", "responses": "response.completed"}


def respaced(upstream: TestServer, event_lines: bool = True) -> web.Application:
    """An upstream that writes its JSON as Python's json does by default (`"content": "x"`):
    the simulator's answers, every event's data re-serialized with a space after each colon
    and comma; without `event:` lines when asked (data alone names a Responses event)."""

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host",)}
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            async with http.post(
                upstream.make_url(request.path), data=await request.read(), headers=headers
            ) as answer:
                response = web.StreamResponse(status=answer.status)
                response.content_type = answer.content_type
                await response.prepare(request)
                async for line in answer.content:
                    if line.startswith(b"event:") and not event_lines:
                        continue
                    if line.startswith(b"data: {"):
                        line = b"data: " + json.dumps(json.loads(line[6:])).encode() + b"\n"
                    await response.write(line)
                await response.write_eof()
                return response

    app = web.Application()
    app.router.add_post("/{path:.*}", forward)
    return app


@pytest.mark.parametrize(
    ("wire", "event_lines"),
    [("chat", False), ("anthropic", True), ("responses", True), ("responses", False)],
)
async def test_a_stream_in_spaced_json_is_timed_to_its_first_token(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, wire: str, event_lines: bool
) -> None:
    sim = Simulator(api_key=KEY, chunk_delay_s=DELAY_S)
    upstream = await aiohttp_server(respaced(await aiohttp_server(sim.app()), event_lines))
    proxy = await start(start_proxy, tmp_path, upstream)
    path, _ = REQUESTS[wire]
    model = "claude" if wire == "anthropic" else "chat"
    headers = {"x-api-key": KEY, "authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as http:
        started = time.perf_counter()
        async with http.post(
            proxy.make_url(path), json=body_for(wire, stream=True), headers=headers
        ) as response:
            assert response.status == 200
            relayed = await response.read()
        whole = time.perf_counter() - started
    assert b'": "' in relayed  # the spaced bytes went through as they came
    last = relayed.rstrip(b"\n").rsplit(b"\n\n", 1)[-1].rsplit(b"data: ", 1)[-1]
    # ...to their end, which the proxy recognized (no error event after it)
    assert last == b"[DONE]" if wire == "chat" else json.loads(last).get("type") == STREAM_END[wire]
    count, first = await observed(proxy, model)
    assert count == 1
    assert DELAY_S <= first < whole - 2 * DELAY_S
