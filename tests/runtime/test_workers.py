"""`agentproxy serve --workers N`: several processes on one port, guard state exact across
them (the Redis store), refused with the embedded store; signals reach every worker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from proxy.runtime.workers import RESPAWN_LIMIT, _may_respawn
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
    tmp_path: Path, simulator: str, server: str, policies: str = BUDGET
) -> tuple[asyncio.subprocess.Process, str]:
    """`serve` with the embedded store and one worker under a parent that replaces it."""
    config = tmp_path / "agentproxy.yaml"
    config.write_text(sim_config(simulator, f"store: {{path: {tmp_path}}}\n{server}\n{policies}"))
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    await wait_ready(url, deadline=30, process=process)
    return process, url


HI: list[Any] = [{"role": "user", "content": "hi"}]
ASK = {"model": "sim", "messages": HI}
SESSION_S = {"x-agentproxy-session": "s"}


async def ask_session(url: str, session: str) -> int:
    body = ASK
    headers = {"x-agentproxy-session": session}
    async with aiohttp.ClientSession() as http:  # a new connection each: none is kept open
        async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
            await r.read()
            return r.status


async def until_replaced(process: asyncio.subprocess.Process, worker: int, url: str) -> int:
    """The new worker's pid, once the parent has replaced `worker` and it answers."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if successors := [pid for pid in workers_of(process.pid) if pid != worker]:
            await wait_ready(url, deadline=30, process=process)
            return successors[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"worker {worker} was not replaced")


async def until_one_worker(process: asyncio.subprocess.Process) -> None:
    """Until a recycled worker has drained and left (only its successor is left)."""
    deadline = time.monotonic() + 30
    while len(workers_of(process.pid)) > 1:
        assert time.monotonic() < deadline, "the old worker never left"
        await asyncio.sleep(0.05)


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
    assert f"worker {first} hands over: worker {second} replaces it" in stderr
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


async def test_the_successor_serves_at_once_and_both_count_one_budget_while_the_old_finishes(
    tmp_path: Path, slow_simulator: str
) -> None:
    """A recycle does not wait for the old worker's longest stream: its successor serves new
    connections at once, while the old worker finishes that stream and answers a kept-alive
    connection once more (telling it to close). Both count against one budget meanwhile:
    3 + 1 (old) + 1 (new) + 1 (old, after the new one) + 2 (new) = the budget's 8, exactly."""
    process, url = await start_recycling(tmp_path, slow_simulator, "server: {max_rss_mb: 100000}")
    words = " ".join(f"word{i}" for i in range(40))  # ~4 s of stream
    long_ask = {"model": "sim", "stream": True, "messages": [{"role": "user", "content": words}]}
    try:
        assert [await ask_session(url, "s") for _ in range(3)] == [200] * 3
        (first,) = workers_of(process.pid)
        async with aiohttp.ClientSession() as kept, aiohttp.ClientSession() as streaming:

            async def on_kept() -> tuple[int, str | None]:
                async with kept.post(url + "/v1/chat/completions", headers=SESSION_S,
                                     json=ASK) as response:  # fmt: skip
                    await response.read()
                    return response.status, response.headers.get("Connection")

            async def stream() -> bytes:
                async with streaming.post(url + "/v1/chat/completions", json=long_ask) as r:
                    assert r.status == 200
                    return await r.read()

            assert await on_kept() == (200, None)  # 4; the connection stays open
            streamed = asyncio.create_task(stream())
            await asyncio.sleep(0.5)  # the stream is under way on the first worker
            process.send_signal(signal.SIGUSR1)
            began = time.monotonic()
            second = await until_replaced(process, first, url)
            assert await ask_session(url, "s") == 200  # 5, on the successor
            assert time.monotonic() - began < 3, "the successor waited for the old stream"
            assert first in workers_of(process.pid) and not streamed.done()
            assert await on_kept() == (200, "close")  # 6, the old worker: knows of the 5th
            body = await streamed
        assert body.count(b"data: ") > 30 and body.rstrip().endswith(b"data: [DONE]")
        statuses = [await ask_session(url, "s") for _ in range(3)]
        assert statuses == [200, 200, 429], statuses  # 7, 8, then refused
    finally:
        stderr = await stop(process)
    assert f"worker {first} hands over: worker {second} replaces it" in stderr
    leftovers = await asyncio.to_thread(lambda: list(tmp_path.glob("handover-*")))
    assert not leftovers, "the hand-over files are not left behind"


async def test_kept_alive_clients_see_no_error_across_recycles(
    tmp_path: Path, simulator: str
) -> None:
    """The openai SDK (retries off, so any error would show) and an aiohttp pool shared by
    several tasks keep their connections alive through two recycles: not one request fails."""
    process, url = await start_recycling(tmp_path, simulator, "server: {max_rss_mb: 100000}", "")
    sdk = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    answered: list[str] = []
    failed: list[str] = []
    stopping = asyncio.Event()

    async def with_sdk(streaming: bool) -> None:
        while not stopping.is_set():
            try:
                if streaming:
                    chunks = await sdk.chat.completions.create(
                        model="sim", messages=HI, stream=True
                    )
                    async for _ in chunks:
                        pass
                else:
                    await sdk.chat.completions.create(model="sim", messages=HI)
                answered.append("sdk")
            except openai.OpenAIError as exc:
                failed.append(repr(exc))

    async def with_aiohttp(http: aiohttp.ClientSession, streaming: bool) -> None:
        while not stopping.is_set():
            try:
                body = {"model": "sim", "messages": HI, "stream": streaming}
                async with http.post(url + "/v1/chat/completions", json=body) as response:
                    await response.read()
                    answered.append("aiohttp") if response.status == 200 else failed.append(
                        f"status {response.status}"
                    )  # fmt: skip
            except aiohttp.ClientError as exc:
                failed.append(repr(exc))

    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=6)) as http:
            clients = [asyncio.create_task(with_sdk(i % 2 == 0)) for i in range(4)] + [
                asyncio.create_task(with_aiohttp(http, i % 2 == 0)) for i in range(4)
            ]
            worker = workers_of(process.pid)[0]
            for _ in range(2):
                await asyncio.sleep(1)
                process.send_signal(signal.SIGUSR1)
                worker = await until_replaced(process, worker, url)
                await until_one_worker(process)
            await asyncio.sleep(0.5)
            stopping.set()
            await asyncio.gather(*clients)
    finally:
        await sdk.close()
        stderr = await stop(process)
    assert not failed, failed[:5]
    assert answered.count("sdk") > 20 and answered.count("aiohttp") > 20
    assert stderr.count("hands over: worker") == 2


# --- a worker the OS kills ------------------------------------------------------------------


async def test_a_worker_killed_by_the_os_is_replaced_and_the_others_serve_on(
    tmp_path: Path, redis_prefix: str, simulator: str
) -> None:
    """kill -9 (as the OOM killer does) one of two workers: requests go on to the other, the
    parent forks a new worker in its place, and SIGTERM still stops everything cleanly."""
    store = f"store: {{backend: redis, url: '{REDIS_URL}', prefix: '{redis_prefix}'}}\n"
    config = tmp_path / "agentproxy.yaml"
    config.write_text(sim_config(simulator, store))
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port),
        "--workers", "2", cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, deadline=30, process=process)
        first, second = workers_of(process.pid)
        os.kill(first, signal.SIGKILL)
        statuses = [await ask_session(url, f"s{index}") for index in range(20)]
        assert statuses == [200] * 20, statuses
        assert process.returncode is None
        deadline = time.monotonic() + 30
        while len(fresh := [p for p in workers_of(process.pid) if p not in (first, second)]) < 1:
            assert time.monotonic() < deadline, "the killed worker was not replaced"
            await asyncio.sleep(0.05)
        assert second in workers_of(process.pid)  # the other worker served on, untouched
        busy_before = cpu_ticks(fresh[0])
        statuses = [await ask_session(url, f"t{index}") for index in range(40)]
        assert statuses == [200] * 40, statuses
        assert cpu_ticks(fresh[0]) > busy_before, "the new worker serves nothing"
    finally:
        stderr = await stop(process)
    assert f"worker {first} was killed by signal 9" in stderr, stderr


def test_a_crash_loop_is_not_respawned_for_ever() -> None:
    killed: list[float] = []
    assert all(_may_respawn(killed) for _ in range(RESPAWN_LIMIT))
    assert not _may_respawn(killed)  # the sixth within a minute: the parent gives up


async def test_a_worker_past_its_hard_memory_ceiling_admits_no_more_requests_while_it_drains(
    tmp_path: Path, slow_simulator: str
) -> None:
    """A ceiling below any process's size (so past the hard one too): once the worker has
    handed over, a request on its kept-alive connection is refused with a 503 in the client's
    wire format (retry: a new connection reaches the successor), while its stream in flight
    goes on to its end."""
    process, url = await start_recycling(tmp_path, slow_simulator, "server: {max_rss_mb: 1}", "")
    words = " ".join(f"word{i}" for i in range(40))  # ~4 s of stream
    long_ask = {"model": "sim", "stream": True, "messages": [{"role": "user", "content": words}]}
    try:
        async with aiohttp.ClientSession() as kept, aiohttp.ClientSession() as streaming:

            async def on_kept() -> tuple[int, str | None, Any]:
                async with kept.post(url + "/v1/chat/completions", json=ASK) as response:
                    body = await response.json()
                    return response.status, response.headers.get("Connection"), body

            async def stream() -> bytes:
                async with streaming.post(url + "/v1/chat/completions", json=long_ask) as r:
                    assert r.status == 200
                    return await r.read()

            assert (await on_kept())[:2] == (200, None)  # the connection stays open
            streamed = asyncio.create_task(stream())
            await asyncio.sleep(2.0)  # the first check (1 s): the worker hands over, drains
            assert not streamed.done()
            status, connection, body = await on_kept()
            assert (status, connection) == (503, "close"), body
            assert body["error"]["code"] == "overloaded", body
            assert "max_rss_mb" in body["error"]["message"]
            body = await streamed
        assert body.rstrip().endswith(b"data: [DONE]")
        assert await ask_session(url, "s") == 200  # a new connection: the successor
    finally:
        stderr = await stop(process)
    assert "admits no new request" in stderr


# Workers that never take SIGTERM over (their loop is not up yet), then the parent is stopped.
STARTING_WORKERS = """
import socket, sys, time
from proxy.runtime import workers

def starting(listener: socket.socket, tell, replacing: bool) -> int:
    time.sleep(60)  # still importing, say: SIGTERM has its default action here
    return 0

sys.exit(workers.run(2, "127.0.0.1", int(sys.argv[1]), starting, "up"))
"""


# Each child lingers just after the fork, before the worker's own code runs: where it still
# has the parent's signal handlers.
SLOW_AFTER_FORK = "import os, time; os.register_at_fork(after_in_child=lambda: time.sleep(1))\n"


@pytest.mark.parametrize("script", [STARTING_WORKERS, SLOW_AFTER_FORK + STARTING_WORKERS])
def test_stopping_workers_still_starting_is_a_clean_stop(script: str) -> None:
    """SIGTERM reaching a worker before its loop handles it kills it (the default action):
    that is the stop the parent asked for, not a failure, so the parent exits 0. A worker
    the stop reaches right after its fork too: the parent's handler, which it inherited, must
    not take the signal there (it would set the child's copy of `stopping` and go on)."""
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(free_port())], cwd=ROOT,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while len(workers_of(process.pid)) < 2:
        assert time.monotonic() < deadline, "the workers were not forked"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
