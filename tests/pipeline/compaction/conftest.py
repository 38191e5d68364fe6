"""The simulated model over a real socket, for the compaction tests that use the real
summarizer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from proxy.policies.spec import Deployment, ServerSettings
from proxy.sim.simulator import Simulator
from proxy.upstream.pool import Upstreams
from tests.pipeline.compaction.factories import SIM_KEY, target


@pytest.fixture
def small_sim() -> Simulator:
    # The model's real window is larger than the 2,000 tokens the proxy is told, so every
    # request the stage lets through must be accepted; the simulator also checks pairing.
    return Simulator(context_window=4096, api_key=SIM_KEY)


@pytest.fixture
async def small_sim_server(aiohttp_server: Any, small_sim: Simulator) -> TestServer:
    server: TestServer = await aiohttp_server(small_sim.app())
    return server


@pytest.fixture
async def upstreams() -> AsyncIterator[Upstreams]:
    pool = Upstreams(lambda: ServerSettings())
    yield pool
    await pool.close()


@pytest.fixture
def sim_target(small_sim_server: TestServer) -> Deployment:
    return target(api_base=str(small_sim_server.make_url("/v1")))
