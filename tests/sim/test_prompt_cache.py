"""Prompt caching in the Anthropic twin: the breakpoint limit, and cache usage that adds up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

from proxy.sim import Simulator, run_simulator
from proxy.sim.anthropic import count_prompt_tokens

JSON = dict[str, Any]
CACHED = {"type": "ephemeral"}
SYSTEM = "You are a careful assistant who reads every file before answering. " * 80  # ~1.4k tokens


@pytest.fixture
def sim() -> Simulator:
    return Simulator(context_window=100_000)


@pytest.fixture
async def client(sim: Simulator) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with (
        run_simulator(sim) as url,
        anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-test", max_retries=0) as sdk,
    ):
        yield sdk


def text(value: str, cached: bool = False) -> JSON:
    return {"type": "text", "text": value} | ({"cache_control": CACHED} if cached else {})


def body(messages: list[JSON], system: str = SYSTEM) -> JSON:
    return {
        "model": "claude-sim",
        "max_tokens": 100,
        "system": [text(system, cached=True)],
        "messages": messages,
    }


async def usage(client: anthropic.AsyncAnthropic, request: JSON) -> tuple[int, int, int]:
    """(cache read, cache creation, uncached input), checked to add up to the whole prompt."""
    reply = await client.messages.create(**request)
    used = reply.usage
    read, created = used.cache_read_input_tokens or 0, used.cache_creation_input_tokens or 0
    assert read + created + used.input_tokens == count_prompt_tokens(request)
    return read, created, used.input_tokens


def tokens(request: JSON) -> int:
    return count_prompt_tokens(request)


async def test_cache_usage_over_three_turns(client: anthropic.AsyncAnthropic) -> None:
    # Turn 1: nothing cached yet; everything up to the last breakpoint is written.
    turn1 = body([{"role": "user", "content": [text("What is in notes.txt?", cached=True)]}])
    assert await usage(client, turn1) == (0, tokens(turn1), 0)

    # Turn 2: the breakpoint moved to the newest block, as Claude Code moves it. The API's
    # lookback finds turn 1's prefix (cache_control itself is not part of the prefix).
    answer1 = {"role": "assistant", "content": "You said: What is in notes.txt?"}
    turn2 = body(
        [
            {"role": "user", "content": [text("What is in notes.txt?")]},
            answer1,
            {"role": "user", "content": [text("And in main.py?", cached=True)]},
        ]
    )
    assert await usage(client, turn2) == (tokens(turn1), tokens(turn2) - tokens(turn1), 0)

    # Turn 3: read turn 2's prefix; write up to the breakpoint; the block after it is input.
    answer2 = {"role": "assistant", "content": "You said: And in main.py?"}
    asked3 = [text("Now compare them.", cached=True), text("Briefly, please.")]
    turn3 = body([*turn2["messages"], answer2, {"role": "user", "content": asked3}])
    up_to_breakpoint = body([*turn3["messages"][:-1], {"role": "user", "content": asked3[:1]}])
    assert await usage(client, turn3) == (
        tokens(turn2),
        tokens(up_to_breakpoint) - tokens(turn2),
        tokens(turn3) - tokens(up_to_breakpoint),
    )

    # A repeat reads everything up to the last breakpoint and writes nothing.
    assert await usage(client, turn3) == (
        tokens(up_to_breakpoint),
        0,
        tokens(turn3) - tokens(up_to_breakpoint),
    )


async def test_a_changed_prefix_misses(client: anthropic.AsyncAnthropic) -> None:
    question = [{"role": "user", "content": "hi"}]
    first, system_only = body(question), tokens(body([]))
    assert await usage(client, first) == (0, system_only, tokens(first) - system_only)
    # The system prompt's breakpoint prefix is cached, a different system prompt is not.
    assert (await usage(client, first))[0] == system_only
    changed = body(question, system=SYSTEM + " Also be brief.")
    assert (await usage(client, changed))[0] == 0


async def test_short_prefixes_are_not_cached(client: anthropic.AsyncAnthropic) -> None:
    short = body([{"role": "user", "content": [text("hi", cached=True)]}], system="Be brief.")
    assert tokens(short) < 1024
    assert await usage(client, short) == (0, 0, tokens(short))
    assert await usage(client, short) == (0, 0, tokens(short))


async def test_the_cache_is_per_simulator_and_reset_clears_it(
    client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    request = body([{"role": "user", "content": "hi"}])
    await usage(client, request)
    assert (await usage(client, request))[0] > 0
    sim.reset()
    assert (await usage(client, request))[0] == 0


async def test_streamed_usage_carries_the_cache_counts(client: anthropic.AsyncAnthropic) -> None:
    request = body([{"role": "user", "content": [text("hello there", cached=True)]}])
    await client.messages.create(**request)
    stream = await client.messages.create(**request, stream=True)
    events = [event async for event in stream]
    start = events[0].message.usage
    assert (start.cache_read_input_tokens, start.input_tokens) == (tokens(request), 0)
    assert events[-2].usage.cache_read_input_tokens == tokens(request)


def with_breakpoints(tools: int, system: int, messages: int) -> JSON:
    schema = {"type": "object", "properties": {}}
    return {
        "model": "claude-sim",
        "max_tokens": 100,
        "tools": [
            {"name": f"tool{i}", "input_schema": schema, "cache_control": CACHED}
            for i in range(tools)
        ],
        "system": [text(f"rule {i}", cached=True) for i in range(system)],
        "messages": [
            {"role": "user", "content": [text(f"q{i}", cached=True) for i in range(messages)]}
        ],
    }


@pytest.mark.parametrize(("shape", "found"), [((1, 2, 2), 5), ((2, 2, 3), 7), ((0, 0, 6), 6)])
async def test_more_than_four_breakpoints_is_400(
    client: anthropic.AsyncAnthropic, shape: tuple[int, int, int], found: int
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(**with_breakpoints(*shape))
    assert caught.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"A maximum of 4 blocks with cache_control may be provided. Found {found}.",
        },
        "request_id": caught.value.request_id,
    }


async def test_four_breakpoints_are_fine_and_automatic_caching_takes_a_slot(
    client: anthropic.AsyncAnthropic,
) -> None:
    assert (await client.messages.create(**with_breakpoints(1, 1, 2))).type == "message"
    three = with_breakpoints(1, 1, 1)
    assert (await client.messages.create(**three, cache_control=CACHED)).type == "message"
    with pytest.raises(anthropic.BadRequestError, match="Found 5"):
        await client.messages.create(**with_breakpoints(1, 1, 2), cache_control=CACHED)
