"""What can be bounded on the litellm path: a non-streaming reply's total time. (litellm's own
HTTP client reads the bytes, so the size caps cannot reach it; docs/configuration.md says so.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from tests.conftest import ProxyFactory
from tests.upstream.hostile import Witness, send


async def test_a_dripping_anthropic_reply_is_cut_at_the_response_timeout(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    witness = Witness()

    async def drip(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            await send(response, witness, b'{"id":"msg_1","type":"message","content":[')
            while True:
                await send(response, witness, b" ")
                await asyncio.sleep(0.05)
        except (ConnectionError, asyncio.CancelledError):
            witness.stopped()
            raise

    app = web.Application()
    app.router.add_post("/v1/messages", drip)
    upstream = await aiohttp_server(app)
    path = tmp_path / "c.yaml"
    path.write_text(
        f"""
server: {{response_timeout_s: 1}}
store: {{path: {tmp_path}}}
model_list:
  - model_name: claude
    litellm_params:
      model: anthropic/claude-sim
      api_base: {str(upstream.make_url("")).rstrip("/")}
      api_key: sk-ant-sim
policies:
  - name: one-attempt
    retry: {{attempts: 1}}
"""
    )
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for _ in range(600):  # litellm is imported in the background; /readyz says when
            async with http.get(str(proxy.make_url("/readyz"))) as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.05)
        started = time.monotonic()
        body = {"model": "claude", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(str(proxy.make_url("/v1/chat/completions")), json=body) as r:
            status, raw = r.status, await r.read()
    elapsed = time.monotonic() - started
    assert status == 504, raw
    assert "raise server.response_timeout_s" in orjson.loads(raw)["error"]["message"]
    assert elapsed < 3
    await asyncio.wait_for(witness.hung_up.wait(), 2)  # litellm's connection was closed
