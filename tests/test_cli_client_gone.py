"""`agentproxy serve` as deployed (a real process, aiohttp's run_app): a client that hangs up
stops the upstream call it was waiting on. The in-process test server always cancels a
handler whose client left; run_app does so only when asked (handler_cancellation)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import free_port
from tests.routes.test_client_gone import stalled_stream
from tests.upstream.hostile import COMPLETION_HEAD, endless, hostile_app

ROOT = Path(__file__).resolve().parent.parent


async def wait_ready(url: str, process: asyncio.subprocess.Process, deadline_s: float) -> None:
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        while time.monotonic() - started < deadline_s and process.returncode is None:
            try:
                async with http.get(url + "/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} not ready within {deadline_s}s (exit code {process.returncode})")


async def test_a_client_hanging_up_stops_the_upstream_call(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    drip_app, drip = hostile_app(endless(COMPLETION_HEAD, b"a", pause_s=0.05), "application/json")
    stall_app, stall = hostile_app(stalled_stream(), "text/event-stream")
    urls = {
        "drip": str((await aiohttp_server(drip_app)).make_url("")).rstrip("/"),
        "stall": str((await aiohttp_server(stall_app)).make_url("")).rstrip("/"),
    }
    config = tmp_path / "agentproxy.yaml"
    lines = [f"store: {{path: {tmp_path / 'state'}}}", "model_list:"]
    for alias, base in urls.items():
        lines += [
            f"  - model_name: {alias}",
            "    litellm_params:",
            f"      model: openai/{alias}",
            f"      api_base: {base}/v1",
        ]
    config.write_text("\n".join(lines) + "\n")
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, process, deadline_s=15)
        ask = {"messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as http:
            # A non-streaming call to an upstream that drips: the client gives up waiting.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(
                    http.post(url + "/v1/chat/completions", json={**ask, "model": "drip"}), 0.5
                )
            await asyncio.wait_for(drip.hung_up.wait(), 2)
            # A stream whose upstream went quiet: the client hangs up after two events.
            response = await http.post(
                url + "/v1/chat/completions", json={**ask, "model": "stall", "stream": True}
            )
            for _ in range(2):
                await response.content.readuntil(b"\n\n")
            response.close()
            await asyncio.wait_for(stall.hung_up.wait(), 2)
    finally:
        if process.returncode is None:
            process.terminate()
        _, stderr = await asyncio.wait_for(process.communicate(), 10)
    assert process.returncode in (0, -15), stderr.decode()
