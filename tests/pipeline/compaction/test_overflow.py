"""Reactive compaction: recognise the providers' overflow errors, compact tighter, never loop."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.messages import Message, pairing_problems
from proxy.pipeline.compaction import CompactionStage
from proxy.pipeline.compaction.budget import tokens_of
from proxy.pipeline.compaction.checkpoints import SessionState
from proxy.pipeline.compaction.overflow import compact_after_overflow
from proxy.policies.spec import CompactionSpec, Policy
from proxy.sim.simulator import Simulator
from proxy.upstream.base import UpstreamHTTPError
from proxy.upstream.overflow import is_context_overflow, stated_tokens
from proxy.upstream.pool import Upstreams
from tests.pipeline.compaction.factories import (
    GOAL,
    SIM_KEY,
    SPEC,
    Scripted,
    actions,
    coding_session,
    context,
    exchange,
    real_summarizer,
    target,
    user,
)


def error(message: str, code: str | None = None) -> bytes:
    body = {"message": message, "type": "invalid_request_error", "code": code}
    return orjson.dumps({"error": body})


OVERFLOWS = [
    error(
        "This model's maximum context length is 8192 tokens. However, your messages resulted "
        "in 9000 tokens. Please reduce the length of the messages.",
        "context_length_exceeded",
    ),
    error("litellm.ContextWindowExceededError: litellm.BadRequestError", "context_length_exceeded"),
    orjson.dumps(
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 210000 tokens > 200000 maximum",
            },
        }
    ),
    error("input length and `max_tokens` exceed context limit: 187254 + 20000 > 200000"),
    error("Input tokens exceed the configured limit of 272000 tokens."),
    error("Your input exceeds the context window of this model."),
    b"Maximum Context Length reached",  # plain text, other capitals
]
NOT_OVERFLOWS = [
    (429, error("Rate limit reached for gpt-4o", "rate_limit_exceeded")),
    (400, error("Invalid value: 'tool'. Supported values are: 'system', 'user'.")),
    (500, b"<html><body>Internal Server Error</body></html>"),
    (401, error("Incorrect API key provided", "invalid_api_key")),
]


@pytest.mark.parametrize("body", OVERFLOWS)
def test_provider_overflow_texts_are_recognised(body: bytes) -> None:
    assert is_context_overflow(400, body)


@pytest.mark.parametrize(("status", "body"), NOT_OVERFLOWS)
def test_other_errors_are_not_overflows(status: int, body: bytes) -> None:
    assert not is_context_overflow(status, body)


def test_a_successful_answer_is_never_an_overflow() -> None:
    assert not is_context_overflow(200, b'{"content": "the maximum context length is 8k"}')


# --- against the simulated model over a real socket ------------------------------------------


@pytest.fixture
def narrow_sim() -> Simulator:
    # The model's real window (2,000) is smaller than the proxy believes (3,000): our estimate
    # fits, the provider overflows — the case reactive compaction exists for.
    return Simulator(context_window=2_000, api_key=SIM_KEY)


@pytest.fixture
async def narrow_server(aiohttp_server: Any, narrow_sim: Simulator) -> TestServer:
    server: TestServer = await aiohttp_server(narrow_sim.app())
    return server


async def test_an_overflow_is_compacted_to_the_tighter_target_and_the_retry_succeeds(
    upstreams: Upstreams,
    narrow_server: TestServer,
) -> None:
    deployment = target(window=3_000, api_base=str(narrow_server.make_url("/v1")))
    history = coding_session(17, content_chars=280)  # ~2,200 tokens: under 0.85 of 3,000
    stage = CompactionStage()
    ctx = context(real_summarizer(upstreams))
    ex = exchange(history, deployment=deployment)
    assert await stage.run(ex, history, ctx) is None  # the estimate says it fits

    with pytest.raises(UpstreamHTTPError) as failed:
        await upstreams.fast.complete(deployment, {"model": "sim", "messages": history}, "r1")
    assert is_context_overflow(failed.value.status, failed.value.body)

    retry = await compact_after_overflow(ex, history, ctx, stage)
    assert retry is not None and pairing_problems(retry) == []
    assert tokens_of(retry) <= SPEC.reactive_target * 3_000
    assert actions(ex) == ["summarized", "overflow_compacted"]
    assert GOAL in retry[1]["content"]
    await upstreams.fast.complete(deployment, {"model": "sim", "messages": retry}, "r2")

    # The same overflow again: the recovery already tried is not offered a second time.
    again = exchange(history, deployment=deployment)
    assert await compact_after_overflow(again, history, ctx, stage) is None
    assert actions(again)[-1] == "overflow_repeated"

    # Later turns compact to the tighter target on their own: no overflow, no new summary.
    longer = [*history, {"role": "assistant", "content": "done"}, user("next")]
    later = exchange(longer, deployment=deployment)
    out = await stage.run(later, longer, ctx)
    assert out is not None and actions(later) == ["checkpoint_reused"]
    await upstreams.fast.complete(deployment, {"model": "sim", "messages": out}, "r3")


# --- edge cases with a scripted summarizer ---------------------------------------------------


async def test_nothing_to_compact_gives_none() -> None:
    history: list[Message] = [{"role": "system", "content": "s"}, user("hi")]
    ex = exchange(history)
    assert await compact_after_overflow(ex, history, context(Scripted()), CompactionStage()) is None
    assert actions(ex) == ["overflow_unrecoverable"]


@pytest.mark.parametrize(
    "spec", [CompactionSpec(reactive=False), CompactionSpec(enabled=False)], ids=str
)
async def test_reactive_compaction_can_be_switched_off(spec: CompactionSpec) -> None:
    history = coding_session(20, content_chars=280)
    ex = exchange(history, policy=Policy(name="p", compaction=spec))
    stage = CompactionStage()
    assert await compact_after_overflow(ex, history, context(Scripted()), stage) is None


async def test_an_unknown_window_compacts_relative_to_what_overflowed() -> None:
    history = coding_session(20, content_chars=280)
    ex = exchange(history, deployment=target(window=None))
    out = await compact_after_overflow(ex, history, context(Scripted()), CompactionStage())
    assert out is not None and pairing_problems(out) == []
    assert tokens_of(out) <= SPEC.reactive_target * tokens_of(history)


async def test_the_stages_own_output_is_mapped_back_to_the_agents_history() -> None:
    """The request path hands back what it sent (our output); checkpoints must still be keyed
    on the agent's history, so the next turn reuses the reactive one without a summarizer."""
    summarize = Scripted()
    stage, ctx = CompactionStage(), context(summarize)
    history = coding_session(24, content_chars=280)
    ex = exchange(history)
    sent = await stage.run(ex, history, ctx)
    assert sent is not None and actions(ex) == ["summarized"]
    retry = await compact_after_overflow(ex, sent, ctx, stage)
    assert retry is not None and tokens_of(retry) < tokens_of(sent)
    assert len(summarize.calls) == 2
    longer = [*history, {"role": "assistant", "content": "done"}, user("next")]
    later = exchange(longer)
    out = await stage.run(later, longer, ctx)
    assert out is not None and actions(later) == ["checkpoint_reused"]
    assert out[: len(retry)] == retry and len(summarize.calls) == 2


async def test_the_learnt_window_never_falls_below_a_prompt_the_model_took() -> None:
    """An overflow at less than a prompt the model already took says the text got denser
    (more tokens per character), not that the window shrank: the window learnt stays at what
    the model took, instead of collapsing turn after turn."""
    stage, ctx = CompactionStage(), context(Scripted())
    deployment = target(window=8_000)
    big, taken, dense = (coding_session(n, content_chars=280) for n in (30, 24, 18))
    model = deployment.model
    assert await stage.compact_to(exchange(big, deployment=deployment), big, ctx, 0.6)
    state = stage.index.peek("s1")
    assert state is not None and state.window_cap == tokens_of(big)
    stage.accepted(exchange(taken, deployment=deployment))  # the model took this one
    assert state.floor_for(model) == tokens_of(taken)
    await stage.compact_to(exchange(dense, deployment=deployment), dense, ctx, 0.6)
    assert state.window_cap == tokens_of(taken) > tokens_of(dense)
    assert state.floor_for("openai/other") == 0  # another model's window is its own
    restored = type(state).from_bytes(state.to_bytes())
    assert (restored.window_cap, restored.window_floor) == (state.window_cap, tokens_of(taken))


def test_an_index_saved_in_estimates_forgets_its_learnt_window() -> None:
    """Before the learnt window was kept in provider tokens it was an estimate (half the real
    figure on code): such an index keeps its checkpoints, and the session learns its window
    again at its next overflow."""
    old = orjson.dumps(
        {"checkpoints": [[4, "00000000000000aa"]], "truncation": None, "window_cap": 5_000,
         "window_model": "openai/sim", "window_floor": 4_000}
    )  # fmt: skip
    state = SessionState.from_bytes(old)
    assert [m.length for m in state.checkpoints] == [4]
    assert (state.window_cap, state.window_floor) == (None, 0)
    state.window_cap, state.window_model, state.window_floor = 9_000, "openai/sim", 7_000
    restored = SessionState.from_bytes(state.to_bytes())
    assert (restored.window_cap, restored.window_floor) == (9_000, 7_000)


@pytest.mark.parametrize(
    ("body", "stated"),
    [
        (OVERFLOWS[0], (9000, 8192)),
        (OVERFLOWS[1], (None, None)),
        (OVERFLOWS[2], (210000, 200000)),
        (OVERFLOWS[3], (187254, 200000)),
        (OVERFLOWS[4], (None, 272000)),
        (OVERFLOWS[5], (None, None)),
        (
            error(
                "This model's maximum context length is 3000 tokens. However, you requested "
                "4100 tokens (3100 in the messages, 1000 in the completion)."
            ),
            (3100, 3000),
        ),
    ],
)
def test_the_providers_own_figures_are_read_from_its_overflow_text(
    body: bytes, stated: tuple[int | None, int | None]
) -> None:
    """What the provider counted is the learnt window's best source: its tokens, not ours."""
    assert stated_tokens(body) == stated
