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


# --- recycling: a worker hands over to a fresh one -------------------------------------------

BUDGET = """
policies:
  - name: capped
    budgets: [{name: eight-calls, limits: {calls: 8}}]
"""


async def start_recycling(
    tmp_path: Path, simulator: str, server: str
) -> tuple[asyncio.subprocess.Process, str]:
    """`serve` with the embedded store and one worker under a parent that replaces it."""
    config = tmp_path / "agentproxy.yaml"
    config.write_text(sim_config(simulator, f"store: {{path: {tmp_path}}}\n{server}\n{BUDGET}"))
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    await wait_ready(url, deadline=30, process=process)
    return process, url


async def ask_session(url: str, session: str) -> int:
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-agentproxy-session": session}
    async with aiohttp.ClientSession() as http:  # a new connection each: none is kept open
        async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
            await r.read()
            return r.status


async def until_replaced(process: asyncio.subprocess.Process, worker: int, url: str) -> int:
    """The new worker's pid, once the parent has replaced `worker` and it answers."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = workers_of(process.pid)
        if children and children != [worker]:
            await wait_ready(url, deadline=30, process=process)
            return children[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"worker {worker} was not replaced")


async def stop(process: asyncio.subprocess.Process) -> str:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    _, stderr = await asyncio.wait_for(process.communicate(), 40)
    assert process.returncode == 0, stderr.decode()
    return stderr.decode()


async def test_a_recycled_worker_hands_its_guard_state_over_and_no_request_fails(
    tmp_path: Path, simulator: str
) -> None:
    """With a ceiling set (here never reached), SIGUSR1 to the parent recycles the worker: it
    drains, leaves its guard state (the embedded store keeps it in memory) and a fresh worker
    takes over on the same port. The session's budget goes on counting where it was, and
    requests sent throughout the hand-over are all answered."""
    process, url = await start_recycling(tmp_path, simulator, "server: {max_rss_mb: 100000}")
    try:
        assert [await ask_session(url, "s") for _ in range(3)] == [200] * 3
        (first,) = workers_of(process.pid)
        others: list[int] = []

        async def keep_asking() -> None:  # another session, during the hand-over
            while len(others) < 40:
                others.append(await ask_session(url, f"other-{len(others)}"))

        asking = asyncio.create_task(keep_asking())
        await asyncio.sleep(0.05)
        process.send_signal(signal.SIGUSR1)
        second = await until_replaced(process, first, url)
        await asking
        assert others == [200] * 40, others
        statuses = [await ask_session(url, "s") for _ in range(6)]
        assert statuses == [200] * 5 + [429], statuses  # 3 + 5 = the budget's 8, exactly
    finally:
        stderr = await stop(process)
    assert f"worker {first} handed over: worker {second} replaces it" in stderr
    assert "left " in stderr and "guard state entries for the next worker" in stderr
    assert "took over " in stderr
    leftovers = await asyncio.to_thread(lambda: list(tmp_path.glob("handover-*")))
    assert not leftovers, "the hand-over file is not left behind"


async def test_a_worker_past_max_rss_mb_is_replaced(tmp_path: Path, simulator: str) -> None:
    """A ceiling below any process's size: the worker leaves at its first check, says why,
    and its successor serves."""
    process, url = await start_recycling(tmp_path, simulator, "server: {max_rss_mb: 1}")
    try:
        (first,) = workers_of(process.pid)
        assert await ask_session(url, "s") == 200
        await until_replaced(process, first, url)
        assert await ask_session(url, "s") == 200
    finally:
        stderr = await stop(process)
    assert "is past server.max_rss_mb (1): handing over to a fresh worker" in stderr
    assert "server.max_rss_mb (1) is too low for this load" in stderr


async def test_a_state_no_successor_took_goes_with_the_parent(
    tmp_path: Path, simulator: str
) -> None:
    """A worker that left its state as the stop came (no successor forked) would leave the
    file behind; the parent removes it when it exits."""
    process, _ = await start_recycling(tmp_path, simulator, "server: {max_rss_mb: 100000}")
    left = tmp_path / f"handover-{process.pid}.json"
    try:
        left.write_bytes(b'{"values": [], "counters": [], "published": {}}')
    finally:
        await stop(process)
    assert not left.exists()
