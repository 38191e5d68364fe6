"""Shared fixtures: a real simulated upstream and a real proxy, both on loopback sockets."""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.app import build_app
from proxy.runtime.head_deadline import ProxyRunner
from proxy.sim.simulator import Simulator

pytest_plugins = ["tests.support.stuck_tasks"]

ProxyFactory = Callable[..., Awaitable[TestServer]]


def missing(what: str, install: str) -> NoReturn:
    """A tool of the machine's that a test needs is not there: skip, naming the package that
    brings it, or fail under CI (`CI` set, as .ci/run does), which must run every test."""
    why = f"{what}: install {install}"
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI must run this test", pytrace=False)
    pytest.skip(why)


@pytest.fixture(autouse=True)
def in_tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run each test in its own folder, so default state paths (.agentproxy) land there."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that would open a connection beyond loopback (litellm's included)."""
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            assert ipaddress.ip_address(address[0]).is_loopback, f"tried to reach {address}"
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture
def sim() -> Simulator:
    return Simulator(context_window=8192, api_key="sk-sim-upstream-secret")


@pytest.fixture
async def sim_server(aiohttp_server: Any, sim: Simulator) -> TestServer:
    server: TestServer = await aiohttp_server(sim.app())
    return server


def sim_config(
    sim_url: str, extra: str = "", more_models: tuple[str, ...] = (), window: int = 8192
) -> str:
    """A config serving alias `sim` (and `more_models`) from the simulator at `sim_url`;
    `window` is the max_input_tokens the proxy believes `sim` has."""
    models = "".join(
        f"""
          - model_name: {alias}
            litellm_params:
              model: openai/{alias}
              api_base: {sim_url}/v1"""
        for alias in more_models
    )
    return textwrap.dedent(
        f"""\
        model_list:
          - model_name: sim
            litellm_params:
              model: openai/sim
              api_base: {sim_url}/v1
              api_key: sk-sim-upstream-secret
            model_info:
              max_input_tokens: {window}{models}
        """
    ) + textwrap.dedent(extra)


@pytest.fixture
def config_path(tmp_path: Path, sim_server: TestServer) -> Path:
    path = tmp_path / "agentproxy.yaml"
    path.write_text(sim_config(str(sim_server.make_url("")).rstrip("/")))
    return path


class ServedLikeServe(TestServer):
    """A TestServer run as `serve` runs the app: its server options (aiohttp's own cancel a
    handler when its client hangs up, which `serve` does not) and its head deadline."""

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        # A handler still running at close is given 5 s (aiohttp's default 60 s, twice, let
        # one stuck handler hold a test's teardown for minutes; serve drains, then 0.25 s).
        return ProxyRunner(self.app, **{"shutdown_timeout": 5.0, **kwargs})


@pytest.fixture
async def start_proxy(aiohttp_server: Any) -> AsyncIterator[ProxyFactory]:
    servers: list[TestServer] = []

    async def start(path: Path, **options: Any) -> TestServer:
        app: web.Application = build_app(path, **options)
        server = ServedLikeServe(app)
        await server.start_server()
        servers.append(server)
        return server

    overran = _ShutdownWarnings()
    logging.getLogger("agentproxy.shutdown").addHandler(overran)
    try:
        yield start
        for server in reversed(servers):
            await server.close()
    finally:
        logging.getLogger("agentproxy.shutdown").removeHandler(overran)
    for message in overran.messages:  # bounded, not hung: said where a CI log keeps it
        warnings.warn(message, stacklevel=1)


class _ShutdownWarnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
async def proxy(start_proxy: ProxyFactory, config_path: Path) -> TestServer:
    return await start_proxy(config_path)


SimProxyFactory = Callable[..., Awaitable[TestServer]]


@pytest.fixture
def proxy_for(aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path) -> SimProxyFactory:
    """A proxy in front of the given Simulator, its state in this test's folder."""

    async def start(sim: Simulator, extra: str = "", *, window: int = 8192) -> TestServer:
        upstream: TestServer = await aiohttp_server(sim.app())
        path = tmp_path / "agentproxy-for-sim.yaml"
        url = str(upstream.make_url("")).rstrip("/")
        path.write_text(sim_config(url, f"store: {{path: {tmp_path}}}\n{extra}", window=window))
        return await start_proxy(path)

    return start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def base_url(server: TestServer) -> str:
    return str(server.make_url("/v1"))


REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix of this test's own on the machine's Redis; its keys are deleted after."""
    import redis

    prefix = f"agentproxy-test-{uuid.uuid4().hex[:12]}:"
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        missing(f"these tests need Redis on {REDIS_URL} ({exc})", "and start redis-server")
    yield prefix
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


OwnRedis = tuple[int, list[subprocess.Popen[bytes]]]  # its port, and its processes so far


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    """A redis-server of this test's own, so the test can stop and restart it."""
    binary = shutil.which("redis-server")
    if binary is None:
        missing("redis-server is not installed", "it with `apt-get install redis-server`")
    port = free_port()
    processes: list[subprocess.Popen[bytes]] = []
    yield port, processes
    for process in processes:
        process.terminate()
        process.wait(5)


def start_redis(port: int, processes: list[subprocess.Popen[bytes]]) -> None:
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL))


@pytest.fixture
def simulator() -> Iterator[str]:
    """`agentproxy simulate` as its own process on a free port; its base URL."""
    yield from _simulate()


@pytest.fixture
def slow_simulator() -> Iterator[str]:
    """A simulator that streams a chunk every 0.1 s: a 30-word answer takes ~3 s."""
    yield from _simulate("--chunk-delay", "0.1")


def _simulate(*options: str) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "simulate", "--port", str(port), *options],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    assert "simulated upstream on" in process.stdout.readline()
    # Its access log goes on: read it, or the pipe fills (~430 requests) and it stops answering.
    threading.Thread(target=process.stdout.read, daemon=True).start()
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=10)
