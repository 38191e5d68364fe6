"""The prompt size the proxy acts on, over real sockets against simulated models whose
tokenizers are not the proxy's estimate: the calibration converges after one turn, a small
model's dense log lines never overflow its window, a known model family is counted exactly
from the first turn, and each tenant's session learns on its own."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.pipeline.compaction.budget import tokens_of
from proxy.pipeline.meter import NEAR
from proxy.sim.model import Tokenizer, chars_per_token, estimate_prompt_tokens
from proxy.sim.simulator import Simulator
from proxy.tokens.tokenizers import load
from tests.conftest import ProxyFactory, base_url

LOG = "\n".join(
    f"2026-11-30 10:{i // 60:02d}:{i % 60:02d} WARN pool {i % 7} slow: {3 + i % 11} ms"
    for i in range(40)
)
KEYS = """
keys:
  api_keys:
    - {name: alice, key: sk-alice}
    - {name: bob, key: sk-bob}
"""


async def start(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    window: int | None,
    model: str = "openai/sim",
    policy: str = "",
) -> TestServer:
    """`window`: what the catalog declares; None: nothing (unknown unless litellm knows it)."""
    url = str(upstream.make_url("")).rstrip("/")
    text = f"""\
        store: {{path: {tmp_path}}}
        model_list:
          - model_name: sim
            litellm_params: {{model: {model}, api_base: "{url}/v1"}}
        """
    if window is not None:
        text += f"""    model_info: {{max_input_tokens: {window}}}\n"""
    path = tmp_path / "tokens.yaml"
    path.write_text(textwrap.dedent(text) + textwrap.dedent(KEYS) + textwrap.dedent(policy))
    return await start_proxy(path)


OPENED: list[openai.AsyncOpenAI] = []


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while OPENED:
        await OPENED.pop().close()


class Agent:
    """A coding agent reading logs, turn after turn, in one session."""

    def __init__(
        self, proxy: TestServer, key: str = "sk-alice", session: str = "s1", output: str = LOG
    ) -> None:
        self.client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key=key, max_retries=0)
        OPENED.append(self.client)
        self.session = session
        self.output = output  # what each turn's tool call returns
        self.history: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a careful operations agent. " * 50},
            {"role": "user", "content": "Find out why the pool is slow."},
        ]

    async def turn(self, step: int) -> tuple[int, int, str]:
        """(the proxy's prompt tokens, the model's reported prompt tokens, applied)."""
        raw = await self.client.chat.completions.with_raw_response.create(
            model="sim",
            messages=self.history,  # type: ignore[arg-type]
            extra_headers={"x-agentproxy-session": self.session},
        )
        reply = raw.parse()
        assert reply.usage is not None
        estimate = int(raw.headers.get("x-agentproxy-prompt-tokens", 0))  # 0: window unknown
        call = {
            "id": f"c{step}",
            "type": "function",
            "function": {"name": "logs", "arguments": f'{{"since": "10:{step:02d}"}}'},
        }
        self.history += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"Step {step}: checking the logs."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{step}", "content": f"step {step}\n{self.output}"},
            {"role": "user", "content": "What do you see?"},
        ]
        return estimate, reply.usage.prompt_tokens, raw.headers.get("x-agentproxy-applied", "")


def error(estimate: int, reported: int) -> float:
    return abs(estimate - reported) / reported


async def test_calibration_converges_on_a_tokenizer_30_percent_off_the_estimate(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=1_000_000, tokenizer=chars_per_token(4 / 1.3))
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), 1_000_000)
    agent = Agent(proxy)
    errors = [error(*(await agent.turn(step))[:2]) for step in range(8)]
    assert 0.2 < errors[0] < 0.3  # the first turn: the estimate alone, ~30% under
    assert max(errors[1:]) <= 0.03, errors  # then calibrated
    assert errors[-1] <= 0.01, errors


async def test_calibration_is_per_tenant_session(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=1_000_000, tokenizer=chars_per_token(4 / 1.3))
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), 1_000_000)
    alice = Agent(proxy, "sk-alice", "shared-name")
    for step in range(3):
        await alice.turn(step)
    bob = Agent(proxy, "sk-bob", "shared-name")  # the same session id, another tenant
    bob.history = list(alice.history)  # and the very same history
    assert error(*(await bob.turn(0))[:2]) > 0.2  # alice's calibration is not his
    assert error(*(await alice.turn(3))[:2]) <= 0.03


SMALL_MODEL = """
policies:
  - name: agents
    offload: {min_tokens: 100000}
"""


async def test_a_small_models_dense_tokens_never_overflow_its_window(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """2.1 characters a token on these log lines: the estimate says half of what the model
    counts. Calibrated, compaction starts before the model's window is reached, every turn."""
    window = 8_000
    sim = Simulator(context_window=window, tokenizer=chars_per_token(2.1))
    proxy = await start(
        start_proxy, tmp_path, await aiohttp_server(sim.app()), window, policy=SMALL_MODEL
    )
    agent = Agent(proxy)
    compacted = 0
    for step in range(14):
        estimate, reported, applied = await agent.turn(step)
        assert "overflow" not in applied, (step, applied)
        assert reported <= window
        compacted += "compaction.summarized" in applied
        if step:
            assert error(estimate, reported) <= 0.03 or "compaction" in applied, step
    assert compacted >= 1
    assert all(r.status == 200 for r in sim.requests)  # the model never refused a prompt


def o200k() -> Tokenizer:
    """A model counting with OpenAI's o200k_base (GPT-4o's): the simulator's tokenizer."""
    encoding = load("o200k_base")
    return lambda texts: sum(encoding.count(text) for text in texts)


async def test_a_known_model_family_is_counted_exactly_from_the_first_turn(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    window = 6_000
    sim = Simulator(context_window=100_000, tokenizer=o200k())
    upstream = await aiohttp_server(sim.app())
    proxy = await start(start_proxy, tmp_path, upstream, window, model="openai/gpt-4o")
    agent = Agent(proxy)
    near: list[float] = []
    for step in range(10):
        estimate, reported, applied = await agent.turn(step)
        if estimate > 0.7 * 0.85 * window and "compaction" not in applied:
            near.append(error(estimate, reported))
    assert near and near[0] <= 0.01, near  # exact before any calibration: GPT-4o's tokenizer
    assert max(near) <= 0.01, near


# Repetitive code, as a tool reads it: about 2 characters a token, half the estimate's 4.
CODE = "\n".join(f"    x_{i} = compute(a[{i}], b[{i}], c={i})" for i in range(40))


async def test_a_session_counted_exactly_stays_in_its_units_after_an_edit(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """A session near the trigger is counted with the model's tokenizer and calibrated
    against those counts. When the client then edits an early message, the counts of its
    history are lost with the match: the estimate (half the count on code) must not be read
    with the calibration learnt for counts. A turn past the model's window is compacted
    before it is sent, not refused by the model."""
    window = 16_000
    sim = Simulator(context_window=window, tokenizer=o200k())
    upstream = await aiohttp_server(sim.app())
    proxy = await start(
        start_proxy, tmp_path, upstream, window, model="openai/gpt-4o", policy=SMALL_MODEL
    )
    agent = Agent(proxy, output=CODE)
    agent.history[0] = {"role": "system", "content": "You are a careful coding agent."}
    trigger, near = 0.85 * window, NEAR * 0.85 * window
    counted = 0
    for step in range(20):
        estimate, reported, applied = await agent.turn(step)
        assert "compaction" not in applied and reported < trigger, (step, applied)
        counted += estimate >= near
        if counted == 2:  # counted exactly, and calibrated against those counts
            break
    assert counted == 2
    agent.output = "\n".join([CODE] * 7)  # a long read...
    estimate, reported, applied = await agent.turn(step + 1)
    # ...and an edit of the first request: the history now overflows the model's window,
    # though its estimate is far under the trigger.
    agent.history[1] = {"role": "user", "content": "Find out why the pool is slow today."}
    assert tokens_of(agent.history) < near < window < exact_tokens(agent.history)
    estimate, reported, applied = await agent.turn(step + 2)
    assert "compaction.summarized" in applied, (estimate, reported, applied)
    assert "overflow" not in applied, applied
    assert reported <= trigger
    assert all(r.status == 200 for r in sim.requests)  # the model never refused a prompt


def exact_tokens(messages: list[dict[str, Any]]) -> int:
    """The simulated model's count of a history."""
    return estimate_prompt_tokens({"messages": messages}, o200k())


@pytest.mark.parametrize(
    ("declared", "model"),
    [(18_000, "openai/gpt-4o"), (None, "openai/unknown-sim")],
    ids=["larger-than-real", "unknown"],
)
async def test_a_window_learnt_from_an_overflow_is_applied_in_the_providers_units(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    declared: int | None,
    model: str,
) -> None:
    """The catalog declares a window the model does not have, or none: its overflow teaches
    the session the real one. On code (about twice the tokens its estimate says) the later
    turns must then be compacted ahead of the model's refusal and fill that window up to the
    trigger, not stop at half of it: the learnt window and the budget it caps are in the same
    units. Another tenant sending the same session id does not share it."""
    window = 12_000
    sim = Simulator(context_window=window, tokenizer=o200k())
    upstream = await aiohttp_server(sim.app())
    proxy = await start(start_proxy, tmp_path, upstream, declared, model=model, policy=SMALL_MODEL)
    agent = Agent(proxy, session="shared-name", output=CODE)
    agent.history[0] = {"role": "system", "content": "You are a careful coding agent."}
    after: list[int] = []
    overflowed = False
    overflowing: list[dict[str, Any]] = []
    for step in range(60):
        sending = list(agent.history)
        _, reported, applied = await agent.turn(step)
        assert reported <= window
        if not overflowed:
            overflowing = sending
        if overflowed:
            assert "overflow" not in applied, (step, applied)  # learnt: compacted ahead
            after.append(reported)
        overflowed = overflowed or "overflow_compacted" in applied
        if len(after) == 16:
            break
    assert overflowed and len(after) == 16
    # Between compactions the session grows to its trigger, 0.85 of the real window (with
    # the learnt window in estimates it stopped at 0.85 of half of it: 0.47).
    assert 0.75 * window <= max(after) <= window, after
    # The same session id under another key learns nothing from alice's overflow: it sends
    # what alice's overflowed with as it is (under the declared window's trigger), and the
    # model refuses it as it refused alice.
    bob = Agent(proxy, key="sk-bob", session="shared-name", output=CODE)
    bob.history = overflowing
    before = len(sim.requests)
    _, reported, applied = await bob.turn(0)
    assert "overflow_compacted" in applied, applied
    assert sim.requests[before].status == 400
