"""Session affinity over real sockets: an alias served by two simulators (each with its own
prompt cache), a session kept on the one it started on, moved only when that one fails or its
circuit is open, and staying where it moved; `routing.affinity: none` is round-robin."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.model import is_summary_request
from proxy.sim.simulator import Fault, Simulator
from proxy.state import CONFIG, EVENTS
from tests.conftest import REDIS_URL, ProxyFactory, base_url

FAST = "retry: {base_s: 0.01, cap_s: 0.05}"
ALICE, BOB = "sk-alice-0001", "sk-bob-0002"
KEYS = f"keys: {{api_keys: [{{name: alice, key: {ALICE}}}, {{name: bob, key: {BOB}}}]}}"
TEXT = "The parser reads one token at a time and keeps the line and column for errors. "


def agent_calls(sim: Simulator) -> int:
    """The agent's requests a simulator answered (the proxy's own summaries left out)."""
    return sum(not is_summary_request(r.body.get("messages") or []) for r in sim.requests)


def streamed(raw: bytes) -> dict[str, Any]:
    """A streamed answer as the completion it adds up to."""
    text = ""
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            for choice in orjson.loads(line[6:]).get("choices") or []:
                text += choice.get("delta", {}).get("content") or ""
    return {"choices": [{"message": {"role": "assistant", "content": text}}]}


@dataclass
class Session:
    """One conversation, its history growing a turn at a time."""

    name: str
    key: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Pair:
    """Alias `sim` served by two simulators, and proxies in front of them."""

    sims: tuple[Simulator, Simulator]
    proxies: list[TestServer]
    http: aiohttp.ClientSession

    async def turn(
        self, session: Session, words: str = TEXT, proxy: int = 0, stream: bool = False
    ) -> tuple[int, dict[str, str], Any, int]:
        """(status, headers, body, index of the simulator that answered) of the next turn."""
        session.messages.append(
            {"role": "user", "content": f"turn {len(session.messages)}: {words}"}
        )
        before = [agent_calls(sim) for sim in self.sims]
        headers = {"x-agentproxy-session": session.name}
        if session.key is not None:
            headers["authorization"] = f"Bearer {session.key}"
        body = {"model": "sim", "messages": session.messages, "stream": stream}
        url = base_url(self.proxies[proxy]) + "/chat/completions"
        async with self.http.post(url, json=body, headers=headers) as response:
            status, raw = response.status, await response.read()
            got = {name.lower(): value for name, value in response.headers.items()}
        answer = streamed(raw) if stream and status == 200 else orjson.loads(raw)
        if status == 200:
            session.messages.append(answer["choices"][0]["message"])
        # The last simulator that took one of the agent's calls answered it.
        grew = [i for i, sim in enumerate(self.sims) if agent_calls(sim) > before[i]]
        last = max(grew, key=lambda i: self.sims[i].requests[-1].at) if grew else -1
        return status, got, answer, last

    def moves(self) -> list[dict[str, Any]]:
        """The event log's `routing.moved` lines (the first proxy's)."""
        self.proxies[0].app[EVENTS].flush()
        path = Path(self.proxies[0].app[CONFIG].current.store.path) / "events.jsonl"
        events = [orjson.loads(line) for line in path.open()]
        return [e for e in events if (e["stage"], e["action"]) == ("routing", "moved")]

    async def metric(self, name: str, **labels: str) -> float:
        async with self.http.get(str(self.proxies[0].make_url("/metrics"))) as response:
            text = await response.text()
        wanted = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
        for line in text.splitlines():
            if line.startswith(name + wanted):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@pytest.fixture
async def pair(aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path) -> Any:
    opened: list[aiohttp.ClientSession] = []

    async def start(
        policy: str = "",
        *,
        keys: str = "",
        store: str | None = None,
        windows: tuple[int, int] = (8192, 8192),
        proxies: int = 1,
    ) -> Pair:
        sims = (Simulator(cache_min_tokens=64), Simulator(cache_min_tokens=64))
        models = ""
        for sim, window in zip(sims, windows, strict=True):
            url = str((await aiohttp_server(sim.app())).make_url("")).rstrip("/")
            models += (
                "  - model_name: sim\n"
                f"    litellm_params: {{model: openai/sim, api_base: {url}/v1}}\n"
                f"    model_info: {{max_input_tokens: {window}}}\n"
            )
        rules = policy if "retry:" in policy else f"{FAST}\n{policy}"
        servers = []
        for index in range(proxies):  # replicas: each its own state, nothing shared
            path = tmp_path / f"proxy-{index}.yaml"
            path.write_text(
                (store or f"store: {{path: {tmp_path / f'state-{index}'}}}")
                + f"\n{keys}\nmodel_list:\n{models}"
                f"policies:\n  - name: p\n{textwrap.indent(textwrap.dedent(rules), '    ')}"
            )
            servers.append(await start_proxy(path))
        http = aiohttp.ClientSession()
        opened.append(http)
        return Pair(sims, servers, http)

    yield start
    for http in opened:
        await http.close()


async def test_a_session_stays_on_one_deployment_and_its_cache_hits(pair: Any) -> None:
    served = await pair()
    session = Session("stays")
    answered, cached = set(), []
    for _ in range(8):
        status, _, body, sim = await served.turn(session, TEXT * 4)
        assert status == 200
        answered.add(sim)
        cached.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert len(answered) == 1  # every turn on the deployment that holds its cache
    assert all(tokens > 0 for tokens in cached[2:])  # once the prefix reaches 128 tokens
    assert agent_calls(served.sims[1 - answered.pop()]) == 0


async def test_sessions_spread_and_replicas_place_them_alike(pair: Any) -> None:
    served = await pair(proxies=2)
    homes = []
    for index in range(16):
        session = Session(f"spread-{index}")
        placed = {(await served.turn(session, proxy=turn % 2))[3] for turn in range(3)}
        assert len(placed) == 1  # both replicas chose the same one, without asking each other
        homes.append(placed.pop())
    assert 0 < sum(homes) < 16  # both deployments took sessions


async def test_a_failing_deployment_moves_the_session_refitted_and_it_stays(pair: Any) -> None:
    # The second deployment's window is smaller: the moved history is fitted to it before the
    # call (one call there, no overflow refusal first), as a fallback's is.
    windows = (8192, 2048)
    served = await pair("compaction: {prepare_at: null}", windows=windows)
    long = TEXT * 24  # ~500 tokens a turn
    for index in range(16):  # a session whose home is the large-window deployment
        session = Session(f"moves-{index}")
        if (await served.turn(session, long))[3] == 0:
            break
    for _ in range(4):
        assert (await served.turn(session, long))[3] == 0
    assert sum(len(str(m)) for m in session.messages) // 4 > windows[1]
    served.sims[0].inject(Fault(status=503))
    calls_there = agent_calls(served.sims[1])
    status, headers, _, sim = await served.turn(session, long)
    assert status == 200 and sim == 1
    applied = headers["x-agentproxy-applied"]
    assert applied.startswith("routing.moved, compaction.")
    [moved] = served.moves()
    assert (moved["from"], moved["to"], moved["reason"]) == ("sim#0", "sim#1", "failed")
    assert moved["session"] == session.name
    # Fitted before its call: one call there, no overflow refused first.
    assert agent_calls(served.sims[1]) == calls_there + 1
    assert await served.metric("agentproxy_affinity_moves_total", model="sim", reason="failed") == 1
    calls_home = agent_calls(served.sims[0])
    for _ in range(3):  # the first deployment answers again, but the session stays moved
        status, headers, _, sim = await served.turn(session)
        assert (
            status == 200
            and sim == 1
            and "routing.moved" not in headers.get("x-agentproxy-applied", "")
        )
    assert agent_calls(served.sims[0]) == calls_home


async def test_an_open_circuit_moves_the_session_before_its_call(pair: Any) -> None:
    served = await pair("circuit: {failures: 1, cooldown_s: 30}\nretry: {attempts: 1}")
    sessions = [Session(f"circuit-{index}") for index in range(12)]
    homes = [(await served.turn(s))[3] for s in sessions]
    first = [s for s, home in zip(sessions, homes, strict=True) if home == 0]
    second = [s for s, home in zip(sessions, homes, strict=True) if home == 1]
    assert len(first) >= 2 and second
    victim, failed, other = first[0], first[1], second[0]
    served.sims[0].inject(Fault(status=503))
    assert (await served.turn(failed))[0] == 503  # opens the first deployment's circuit
    calls_home = agent_calls(served.sims[0])
    status, headers, _, sim = await served.turn(victim)
    assert status == 200 and sim == 1 and agent_calls(served.sims[0]) == calls_home
    assert headers["x-agentproxy-applied"] == "routing.moved"
    [moved] = served.moves()
    assert (moved["from"], moved["to"], moved["reason"]) == ("sim#0", "sim#1", "circuit_open")
    assert (await served.turn(other))[3] == 1  # its own session is untouched


async def test_affinity_none_takes_the_deployments_in_turn(pair: Any) -> None:
    served = await pair("routing: {affinity: none}")
    session = Session("turns")
    placed = [(await served.turn(session))[3] for _ in range(4)]
    assert placed in ([0, 1, 0, 1], [1, 0, 1, 0])
    served.sims[placed[-1] ^ 1].inject(Fault(status=503))
    status, headers, _, _ = await served.turn(session)
    assert status == 200 and "routing.moved" not in headers.get("x-agentproxy-applied", "")


async def test_a_second_key_with_the_same_session_id_is_placed_on_its_own(pair: Any) -> None:
    served = await pair(keys=KEYS)
    for index in range(32):  # a session id both keys start on the same deployment with
        alice, bob = Session(f"shared-{index}", ALICE), Session(f"shared-{index}", BOB)
        home = (await served.turn(alice))[3]
        if (await served.turn(bob))[3] == home:
            break
    else:
        pytest.fail("no session id placed both keys alike")
    served.sims[home].inject(Fault(status=503))
    assert (await served.turn(alice))[3] == 1 - home  # alice moved...
    assert (await served.turn(bob))[3] == home  # ...bob, same session id, did not follow
    assert (await served.turn(alice))[3] == 1 - home  # and alice stays moved


async def test_the_openai_sdk_sees_one_deployment_for_its_session(pair: Any) -> None:
    served = await pair()
    client = openai.AsyncOpenAI(
        base_url=base_url(served.proxies[0]), api_key="unused", max_retries=0
    )
    messages: list[Any] = []
    for turn in range(4):
        messages.append({"role": "user", "content": f"turn {turn}: {TEXT}"})
        reply = await client.chat.completions.create(
            model="sim", messages=messages, extra_headers={"x-agentproxy-session": "sdk"}
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    await client.close()
    assert sorted(agent_calls(sim) for sim in served.sims) == [0, 4]


async def test_replicas_on_one_redis_keep_a_moved_session_where_it_moved(
    pair: Any, redis_prefix: str
) -> None:
    store = f"store: {{backend: redis, url: {REDIS_URL}, prefix: '{redis_prefix}'}}"
    served = await pair(store=store, proxies=2)
    session = Session("hops")
    home = (await served.turn(session, proxy=0))[3]
    assert (await served.turn(session, proxy=1))[3] == home
    served.sims[home].inject(Fault(status=503))
    assert (await served.turn(session, proxy=0))[3] == 1 - home
    # The other replica saw no failure (its circuits are its own), yet the session stays moved.
    for turn in range(4):
        assert (await served.turn(session, proxy=1 - turn % 2))[3] == 1 - home


async def test_a_stream_moves_before_its_first_byte_and_stays(pair: Any) -> None:
    served = await pair()
    session = Session("streams")
    home = (await served.turn(session, stream=True))[3]
    assert (await served.turn(session, stream=True))[3] == home
    served.sims[home].inject(Fault(status=503))
    status, headers, answer, sim = await served.turn(session, stream=True)
    assert status == 200 and sim == 1 - home
    assert headers["x-agentproxy-applied"].startswith("routing.moved")
    assert answer["choices"][0]["message"]["content"].startswith("You said:")
    for _ in range(2):
        assert (await served.turn(session, stream=True))[3] == 1 - home
