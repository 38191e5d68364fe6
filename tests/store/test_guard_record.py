"""The guards (loops, session circuit) keep one record per session: a turn reads the state
store once for both, however many guards ask, and each guard's part survives the other's
writes. Over real sockets, against the real proxy."""

from __future__ import annotations

from pathlib import Path

import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Fault, Simulator
from proxy.state import CONTROL
from proxy.store import guard_record
from tests.conftest import ProxyFactory
from tests.routes.test_loops import Agent, client, start, stubborn_model

POLICIES = """
policies:
  - name: guarded
    loops: {ladder: [warn, no_tools, block]}
    circuit: {session_failures: 3}
"""


@pytest.fixture
def sim() -> Simulator:
    return Simulator(responder=stubborn_model)  # the same tool call, turn after turn


@pytest.fixture
async def proxy(start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer) -> TestServer:
    return await start(start_proxy, tmp_path, sim_server, POLICIES)


async def test_a_turn_reads_the_state_once_for_every_guard(proxy: TestServer) -> None:
    state = proxy.app[CONTROL].sessions.state
    reads: list[tuple[str, str]] = []
    real_get = state.get

    async def counted(space: str, key: str) -> bytes | None:
        reads.append((space, key))
        return await real_get(space, key)

    state.get = counted  # type: ignore[method-assign]
    agent = Agent(proxy, False, {"x-agentproxy-session": "one-read"})
    sdk = client(proxy)
    for turn in range(5):
        reads.clear()
        await agent.turn(sdk)
        assert reads == [(guard_record.SPACE, "open:/one-read")], turn  # circuit and loops
    assert "loops.no_tools" in agent.applied[-1]  # the loop ladder climbed all the same


async def test_each_guards_part_survives_the_others_writes(
    proxy: TestServer, sim: Simulator
) -> None:
    state = proxy.app[CONTROL].sessions.state
    agent = Agent(proxy, False, {"x-agentproxy-session": "both"})
    sdk = client(proxy)
    for _ in range(4):
        await agent.turn(sdk)  # the loop is on record (warned)
    sim.inject(Fault(status=400, times=1))
    with pytest.raises(openai.BadRequestError):
        await agent.turn(sdk)  # the failure the circuit counts
    record = orjson.loads(await state.get(guard_record.SPACE, "open:/both") or b"{}")
    assert set(record) == {"loop", "circuit"}
