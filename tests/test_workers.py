"""`agentproxy serve --workers N`: several processes on one port, guard state exact across
them (the Redis store), refused with the embedded store; signals reach every worker."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from tests.conftest import REDIS_URL, free_port, sim_config
from tests.test_cli import ROOT, agentproxy, wait_ready


def test_more_than_one_worker_with_the_embedded_store_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "agentproxy.yaml"
    config.write_text(sim_config("http://127.0.0.1:9911") + f"store: {{path: {tmp_path}}}\n")
    result = agentproxy("serve", "--config", str(config), "--workers", "2", "--port",
                        str(free_port()))  # fmt: skip
    assert result.returncode == 2
    assert "--workers 2 needs the Redis store (store: {backend: redis" in result.stderr
    for bad in ("0", "many"):
        result = agentproxy("serve", "--config", str(config), "--workers", bad)
        assert result.returncode == 2 and "--workers" in result.stderr, bad


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def workers_of(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def test_two_workers_share_one_port_and_their_guard_state(
    tmp_path: Path, redis_prefix: str, simulator: str
) -> None:
    budget = """
policies:
  - name: capped
    budgets: [{name: five-calls, scope: key, limits: {calls: 5}}]
"""
    store = f"store: {{backend: redis, url: '{REDIS_URL}', prefix: '{redis_prefix}'}}\n"
    config = tmp_path / "agentproxy.yaml"
    config.write_text(sim_config(simulator, store + budget))
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port),
        "--workers", "2", cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, deadline=30, process=process)
        assert process.stdout is not None
        assert "[2 workers]" in (await asyncio.wait_for(process.stdout.readline(), 10)).decode()
        children = workers_of(process.pid)
        assert len(children) == 2
        busy_before = [cpu_ticks(pid) for pid in children]
        answered: list[int] = []
        ask = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(40):  # a new connection each: the kernel spreads them over both
            async with aiohttp.ClientSession() as http:
                async with http.post(url + "/v1/chat/completions", json=ask) as response:
                    answered.append(response.status)
                    await response.read()
        assert answered.count(200) == 5, answered  # one budget, counted once across workers
        busy = [cpu_ticks(pid) - before for pid, before in zip(children, busy_before, strict=True)]
        assert all(ticks > 0 for ticks in busy), f"a worker served nothing: {busy}"

        config.write_text(sim_config(simulator, store + budget, more_models=("sim-two",)))
        process.send_signal(signal.SIGHUP)  # the parent passes it to every worker
        deadline = time.monotonic() + 10
        while True:
            seen = set()
            for _ in range(10):
                async with aiohttp.ClientSession() as http:
                    async with http.get(url + "/v1/models") as response:
                        seen.add(len((await response.json())["data"]))
            if seen == {2}:
                break
            assert time.monotonic() < deadline, f"not every worker reloaded: {seen}"
            await asyncio.sleep(0.2)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 40)
    assert process.returncode == 0, stderr.decode()
    assert stderr.decode().count("stopping: no new connections") == 2
