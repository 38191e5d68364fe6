"""The prompt meter: estimates far from a decision, the model's tokenizer near it (each text
counted once, a session's new messages only), and the calibration it learns from reported
usage, per scoped session and model."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from proxy.exchange import Exchange, PromptMeasure, Usage
from proxy.messages import TOKENS_PER_MESSAGE, text_of
from proxy.pipeline.compaction.budget import message_tokens
from proxy.pipeline.compaction.memo import Seen, SeenHistories
from proxy.pipeline.meter import PromptMeter
from proxy.tokens.tokenizers import Tokenizer, Tokenizers, load
from tests.pipeline.factories import deployment, exchange

SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 40}
LOG = "\n".join(f"2026-11-30 10:{i % 60:02d}:00 INFO request {i} served in 4 ms" for i in range(80))


class Spy:
    """A tokenizer litellm ships, noting each text it counts and on which thread."""

    def __init__(self, name: str = "o200k_base") -> None:
        self.inner = load(name)
        self.name = self.inner.name
        self.texts: list[str] = []
        self.threads: set[str] = set()

    def count(self, text: str) -> int:
        self.texts.append(text)
        self.threads.add(threading.current_thread().name)
        return self.inner.count(text)


def meter_with(spy: Spy) -> PromptMeter:
    def loader(name: str) -> Tokenizer:
        assert name == spy.name
        return spy

    return PromptMeter(Tokenizers(loader))


def history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Fix the parser."}]
    for i in range(turns):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"run {i}\n{LOG}"},
        ]
    return messages


def gpt4o(
    messages: list[dict[str, Any]],
    session: str = "key:a/s1",
    tools: Any = None,
    model: str = "openai/gpt-4o",
) -> Exchange:
    ex = exchange(messages, session=session, **({"tools": tools} if tools else {}))
    ex.deployment = dataclasses.replace(deployment(alias="gpt"), model=model)
    return ex


async def test_far_from_the_limit_the_estimate_stands_and_nothing_loads() -> None:
    loads: list[str] = []

    def loader(name: str) -> Tokenizer:
        loads.append(name)
        return load(name)

    meter = PromptMeter(Tokenizers(loader))
    seen = SeenHistories().remember("s", history(2))
    ex = gpt4o(seen.messages)
    measure = await meter.measure(ex, seen, 0, limit=1_000_000)
    assert measure.total == sum(seen.costs) and measure.factor == 1.0 and not loads
    assert ex.prompt is not None and not ex.prompt.exact and seen.exact == 0


async def test_near_the_limit_messages_are_counted_by_the_models_tokenizer() -> None:
    spy = Spy()
    seen = SeenHistories().remember("s", history(3))
    estimate = sum(seen.costs)
    measure = await meter_with(spy).measure(gpt4o(seen.messages), seen, 0, limit=estimate)
    assert seen.exact == len(seen.messages)
    expected = [TOKENS_PER_MESSAGE + spy.inner.count(text_of(m)) for m in seen.messages]
    assert seen.costs == expected and measure.total == sum(expected)
    assert measure.total > 1.3 * estimate  # log lines: far more tokens than characters / 4


async def test_a_warm_turn_counts_only_its_new_messages_and_texts_once() -> None:
    spy = Spy()
    meter, histories = meter_with(spy), SeenHistories()
    tools = [{"type": "function", "function": {"name": "bash", "description": "x" * 400}}]
    first = history(3)
    seen = histories.remember("s", first)
    await meter.measure(gpt4o(first, "key:a/s", tools), seen, 0, limit=1)
    spy.texts.clear()
    grown = history(4)
    seen = histories.remember("s", grown)
    await meter.measure(gpt4o(grown, "key:a/s", tools), seen, 0, limit=1)
    assert spy.texts == [text_of(m) for m in grown[len(first) :]]  # tools: by their hash
    # Another session sending the same long texts finds them by hash: only the short ones.
    spy.texts.clear()
    other = histories.remember("t", grown)
    await meter.measure(gpt4o(grown, "key:a/t", tools), other, 0, limit=1)
    assert all(len(text) < 256 for text in spy.texts)


async def test_a_large_batch_is_counted_off_the_event_loop() -> None:
    spy = Spy()
    seen = SeenHistories().remember("s", history(40))  # ~200 KB of logs
    await meter_with(spy).measure(gpt4o(seen.messages), seen, 0, limit=1)
    assert threading.current_thread().name not in spy.threads


async def test_the_calibration_is_learned_per_session_and_model() -> None:
    meter = PromptMeter(Tokenizers(lambda name: load(name)))
    messages = [{"role": "user", "content": "x" * 4000}]  # estimate 1004
    seen = Seen(list(messages), [message_tokens(m) for m in messages])
    ex = exchange(messages, session="key:a/s1")
    await meter.measure(ex, seen, 0, limit=1_000_000)
    ex.add_usage(Usage(1305, 10))  # the provider counts 30% more
    meter.learn(ex, ex.accounting.usage)
    again = exchange(messages, session="key:a/s1")
    measure = await meter.measure(again, seen, 0, limit=1_000_000)
    assert abs(measure.factor - 1305 / 1004) < 1e-9 and again.prompt is not None
    assert again.prompt.estimate == 1305
    other = exchange(messages, session="key:b/s1")  # another tenant's session of that name
    assert (await meter.measure(other, seen, 0, limit=1_000_000)).factor == 1.0


async def test_what_was_not_one_reported_call_of_the_measured_model_teaches_nothing() -> None:
    meter = PromptMeter(Tokenizers(lambda name: load(name)))
    messages = [{"role": "user", "content": "x" * 4000}]
    seen = Seen(list(messages), [message_tokens(m) for m in messages])

    async def taught(change: Any) -> bool:
        ex = exchange(messages, session="key:a/new")
        await meter.measure(ex, seen, 0, limit=1_000_000)
        ex.add_usage(Usage(2000, 1))
        change(ex)
        meter.learn(ex, ex.accounting.usage)
        return meter.ratio("key:a/new", "openai/sim") is not None

    assert not await taught(lambda ex: ex.add_usage(Usage(2000, 1)))  # two calls (recall)
    assert not await taught(lambda ex: setattr(ex.accounting, "usage_estimated", True))  # cut short
    assert not await taught(lambda ex: setattr(ex, "deployment", deployment(alias="other")))
    assert not await taught(
        lambda ex: setattr(ex.accounting.usage, "prompt_tokens", 10**6)
    )  # 1,000x off
    assert await taught(lambda ex: None)


@pytest.mark.parametrize(
    "model, tokenizer", [("openai/gpt-4o", "o200k_base"), ("openai/agent-model", "cl100k_base")]
)
async def test_a_ratio_learned_on_estimates_and_exact_counts(model: str, tokenizer: str) -> None:
    """The model's own tokenizer needs no calibration to start from; a borrowed one (a model
    of no family litellm knows) starts from the figure the estimate's calibration gave."""
    spy = Spy(tokenizer)
    meter = meter_with(spy)
    histories = SeenHistories()
    first = history(2)
    seen = histories.remember("s", first)
    ex = gpt4o(first, "key:a/s", model=model)
    await meter.measure(ex, seen, 0, limit=1_000_000)  # far: estimates
    reported = int(sum(seen.costs) * 1.5)
    ex.add_usage(Usage(reported, 1))
    meter.learn(ex, ex.accounting.usage)
    learned = meter.ratio("key:a/s", model)
    assert learned is not None and not learned.exact
    grown = history(3)
    seen = histories.remember("s", grown)
    estimated = PromptMeasure(model, sum(seen.costs), len(grown), learned.value)
    again = gpt4o(grown, "key:a/s", model=model)
    measure = await meter.measure(again, seen, 0, limit=1)  # near: now exact
    assert again.prompt is not None and again.prompt.exact
    assert measure.total != estimated.total
    if tokenizer == "o200k_base":
        assert again.prompt.estimate == measure.total  # the exact count as it is
    else:
        assert abs(again.prompt.estimate - estimated.estimate) <= 1  # the same calibrated figure


async def test_a_ratio_learnt_on_counts_carries_over_to_the_estimate_after_an_edit() -> None:
    """An edit of an early message loses the session's counts with its match: the estimate
    that stands in for them is read with the calibration in its own units (the text's
    density the counts showed), not with the ratio learnt for counts."""
    meter, histories = meter_with(Spy()), SeenHistories()
    first = history(3)
    seen = histories.remember("s", first)
    ex = gpt4o(first, "key:a/s")
    counted = (await meter.measure(ex, seen, 0, limit=1)).total  # near: counted
    ex.add_usage(Usage(counted, 1))  # the provider agrees with the model's tokenizer
    meter.learn(ex, ex.accounting.usage)
    edited = [SYSTEM, {"role": "user", "content": "Fix the parser, please."}, *first[2:]]
    seen = histories.remember("s", edited)
    assert seen.exact == 0  # the counts are lost
    again = gpt4o(edited, "key:a/s")
    measure = await meter.measure(again, seen, 0, limit=1_000_000)  # far: the estimate stands
    assert again.prompt is not None and not again.prompt.exact
    assert measure.total == sum(seen.costs) < counted / 1.3  # in the estimate's units...
    assert abs(again.prompt.estimate - counted) <= 0.01 * counted  # ...read as the count
    assert abs(measure.factor * measure.total - counted) <= 0.01 * counted
    other = gpt4o(edited, "key:b/s")  # another tenant's session of that name
    seen = histories.remember("key:b/s", edited)
    assert (await meter.measure(other, seen, 0, limit=1_000_000)).factor == 1.0


async def test_counts_of_another_models_tokenizer_are_counted_again() -> None:
    """A fallback measures the session's history for another model: the counts its memo
    holds are the first model's, in another tokenizer's units, and are not taken as its."""
    meter, histories = PromptMeter(Tokenizers(load)), SeenHistories()
    messages = history(3)
    seen = histories.remember("s", messages)
    await meter.measure(gpt4o(messages, "key:a/s"), seen, 0, limit=1)  # o200k_base's counts
    fallback = gpt4o(messages, "key:a/s", model="anthropic/claude-sonnet-4-5")
    measure = await meter.measure(fallback, seen, 0, limit=1)
    claude = load("anthropic")
    expected = [TOKENS_PER_MESSAGE + claude.count(text_of(m)) for m in messages]
    assert seen.costs == expected and measure.total == sum(expected)
    assert fallback.prompt is not None and fallback.prompt.exact
