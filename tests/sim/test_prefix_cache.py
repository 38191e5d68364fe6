"""The chat twin's automatic prompt cache and the simulator's own tokenizer, through the
real OpenAI SDK over a socket: cached tokens are the previous request's prefix, honestly."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from proxy.sim import Simulator, run_simulator
from proxy.sim.model import chars_per_token, estimate_prompt_tokens

SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 200}  # ~1.6k tokens


@pytest.fixture
def sim() -> Simulator:
    return Simulator(context_window=100_000)


@pytest.fixture
async def client(sim: Simulator) -> AsyncIterator[openai.AsyncOpenAI]:
    async with (
        run_simulator(sim) as url,
        openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0) as sdk,
    ):
        yield sdk


async def ask(client: openai.AsyncOpenAI, messages: list[dict[str, Any]], **body: Any) -> Any:
    reply = await client.chat.completions.create(
        model="sim",
        messages=messages,  # type: ignore[arg-type]
        **body,
    )
    return reply.usage


def turn(n: int) -> list[dict[str, Any]]:
    """The request of turn n: the request of turn n - 1, its answer and a new user message."""
    history: list[dict[str, Any]] = [SYSTEM]
    for i in range(n + 1):
        if i:
            history.append({"role": "assistant", "content": f"Done with step {i - 1}."})
        history.append(
            {"role": "user", "content": f"Step {i}: " + "read the parser and explain it. " * 20}
        )
    return history


async def test_a_growing_history_reads_its_previous_prompt_from_the_cache(
    client: openai.AsyncOpenAI,
) -> None:
    first = await ask(client, turn(0))
    assert first.prompt_tokens_details.cached_tokens == 0  # nothing sent before
    for n in range(1, 4):
        usage = await ask(client, turn(n))
        shared = estimate_prompt_tokens({"messages": turn(n - 1)})  # the previous request
        cached = usage.prompt_tokens_details.cached_tokens
        assert cached == shared - shared % 128 and cached > 1024
        assert usage.prompt_tokens == estimate_prompt_tokens({"messages": turn(n)})


async def test_a_prefix_under_1024_tokens_or_another_cache_key_is_not_cached(
    client: openai.AsyncOpenAI,
) -> None:
    short = [{"role": "user", "content": "hi"}]
    await ask(client, short)
    usage = await ask(client, [*short, {"role": "assistant", "content": "yo"}, *short])
    assert usage.prompt_tokens_details.cached_tokens == 0
    await ask(client, turn(1), extra_body={"prompt_cache_key": "a"})
    usage = await ask(client, turn(2), extra_body={"prompt_cache_key": "b"})
    assert usage.prompt_tokens_details.cached_tokens == 0
    usage = await ask(client, turn(2), extra_body={"prompt_cache_key": "a"})
    assert usage.prompt_tokens_details.cached_tokens > 1024


async def test_changed_tools_invalidate_the_cache(client: openai.AsyncOpenAI) -> None:
    tool = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
    await ask(client, turn(1), tools=[tool])
    other = {"type": "function", "function": {"name": "write", "parameters": {"type": "object"}}}
    usage = await ask(client, turn(2), tools=[other])
    assert usage.prompt_tokens_details.cached_tokens == 0


async def test_a_simulator_counts_with_the_tokenizer_it_is_given() -> None:
    tokenizer = chars_per_token(4 / 1.3)  # 30% more tokens than chars/4
    denser = Simulator(tokenizer=tokenizer)
    async with (
        run_simulator(denser) as url,
        openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as sdk,
    ):
        text = "x" * 4000
        usage = await ask(sdk, [{"role": "user", "content": text}])
    assert usage.prompt_tokens == tokenizer([text]) + 4  # and the message's 4
    assert abs(usage.prompt_tokens - 4 - 1.3 * 1000) <= 1
    assert usage.completion_tokens == tokenizer(["You said: " + text[:200]])  # counted alike
