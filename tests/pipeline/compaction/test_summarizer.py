"""The summarizer: its bounded transcript, and its request as a child exchange of the
request it summarizes for (its route-level behaviour: tests/routes/test_summarizer.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from proxy.messages import estimate_tokens
from proxy.pipeline.compaction.summarizer import (
    fit_to,
    output_limit,
    render_transcript,
    summary_exchange,
    summary_request,
)
from proxy.policies.spec import CompactionSpec, Policy
from proxy.sim.model import summary_sections
from proxy.sim.simulator import Simulator
from proxy.upstream.base import UpstreamHTTPError
from proxy.upstream.pool import Upstreams
from tests.pipeline.compaction.factories import (
    GOAL,
    SIM_KEY,
    coding_session,
    exchange,
    real_summarizer,
    target,
    user,
)

# --- the summarizer's transcript ----------------------------------------------------------


def test_the_transcript_is_bounded_per_message_and_in_total() -> None:
    history = coding_session(30, content_chars=5_000)
    text = render_transcript(history, 1_000, 20_000)
    assert len(text) <= 20_100
    assert "[#2 user]" in text and "chars of the transcript left out" in text
    assert "[#4 tool result for call_0]" in text


# --- the summary request as a child exchange ----------------------------------------------


def test_a_summary_is_a_child_exchange_of_the_request() -> None:
    spec = CompactionSpec(summarizer_model="sim")
    ex = exchange([user(GOAL)], policy=Policy(name="p", compaction=spec), session="key:a/s1")
    ex.identity.owner, ex.identity.parent_session, ex.recovery.deadline = (
        "key:a",
        "key:a/parent",
        123.0,
    )
    child = summary_exchange(ex)
    assert (child.identity.session, child.identity.owner) == (ex.identity.session, "key:a")
    assert child.identity.parent_session == "key:a/parent"
    assert (child.identity.request_id, child.identity.key, child.timing.started) == (
        ex.identity.request_id,
        ex.identity.key,
        ex.timing.started,
    )
    assert child.recovery.deadline == 123.0  # the request's deadline covers its summaries
    assert child.alias == "sim" and child.deployment is None  # control routes it
    assert child.policy.name == "p" and child.policy.retry == ex.policy.retry
    assert not child.policy.compaction.enabled and not child.policy.recall.enabled
    assert ex.policy.compaction.enabled  # the request's own policy is untouched

    own = summary_exchange(exchange([user(GOAL)]))  # no summarizer_model: the request's model
    assert own.alias == "sim" and own.deployment is not None

    elsewhere = Policy(name="p", compaction=CompactionSpec(summarizer_model="nope"))
    with pytest.raises(LookupError, match="'nope' is not a configured model alias"):
        summary_exchange(exchange([user(GOAL)], policy=elsewhere))


# --- the request fitted to the summarizer's window ----------------------------------------


@pytest.mark.parametrize("window", [2_048, 8_192, 128_000])
def test_the_request_fits_the_summarizers_window_with_its_answer(window: int) -> None:
    history = coding_session(200, content_chars=2_000)  # far more than any of these windows
    fit = fit_to(window, room=400)
    body = summary_request(target(window), history, fit)
    assert body["max_tokens"] == min(400, window // 4)
    prompt = sum(estimate_tokens(m) for m in body["messages"])
    assert prompt + body["max_tokens"] <= window
    assert prompt + body["max_tokens"] >= 0.8 * window or fit.transcript_chars == 200_000
    words = int(body["max_tokens"] * 0.6)
    assert body["messages"][1]["content"].startswith(
        f"Transcript to summarize (answer with the four sections, in at most {words} words):"
    )


def test_a_small_room_and_an_unknown_window_still_bound_the_answer() -> None:
    assert fit_to(None, room=10).max_tokens == 64
    assert fit_to(None, room=100_000).max_tokens == 2_048
    assert fit_to(1_000, room=900).max_tokens == 250


def test_openais_own_api_gets_max_completion_tokens_with_room_to_reason() -> None:
    official = dataclasses.replace(target(), api_base=None)
    assert output_limit(official, 500) == {"max_completion_tokens": 500 + 4_096}
    assert output_limit(target(), 500) == {"max_tokens": 500}  # any other server


async def test_an_overflowing_summary_request_is_retried_once_with_half_the_transcript(
    aiohttp_server: Any, upstreams: Upstreams
) -> None:
    """The model's real window (1,500) is smaller than the proxy's estimate says (2,048), as
    with a small model that gets fewer characters per token than four."""
    sim = Simulator(context_window=1_500, api_key=SIM_KEY)
    server = await aiohttp_server(sim.app())
    deployment = target(2_048, api_base=str(server.make_url("/v1")))
    history = coding_session(30, content_chars=600)
    ex = exchange(history, deployment=deployment)
    summary = await real_summarizer(upstreams)(ex, history[1:], 300)
    assert summary_sections(summary)["SESSION INTENT"] == GOAL
    assert [r.status for r in sim.requests] == [400, 200]
    first, second = (r.body for r in sim.requests)
    assert first["max_tokens"] == second["max_tokens"] == 300
    sizes = [len(b["messages"][1]["content"]) for b in (first, second)]
    assert 0.45 < sizes[1] / sizes[0] < 0.6
    assert (
        len(ex.accounting.side_calls) == 1 and ex.recovery.calls == 0
    )  # the failed call charged nothing


async def test_a_second_overflow_gives_up(aiohttp_server: Any, upstreams: Upstreams) -> None:
    sim = Simulator(context_window=500, api_key=SIM_KEY)
    server = await aiohttp_server(sim.app())
    deployment = target(2_048, api_base=str(server.make_url("/v1")))
    history = coding_session(30, content_chars=600)
    with pytest.raises(UpstreamHTTPError):
        await real_summarizer(upstreams)(exchange(history, deployment=deployment), history, 300)
    assert [r.status for r in sim.requests] == [400, 400]


async def test_the_retry_halves_what_was_sent_when_that_was_under_the_limit(
    aiohttp_server: Any, upstreams: Upstreams
) -> None:
    """A short stretch on a model whose tokens are half our estimate: its whole transcript
    (well under the limit) overflows, so the retry sends half of it, not half of the limit."""
    sim = Simulator(context_window=850, api_key=SIM_KEY)
    server = await aiohttp_server(sim.app())
    deployment = target(2_048, api_base=str(server.make_url("/v1")))
    history = coding_session(1, content_chars=1_500)
    summary = await real_summarizer(upstreams)(
        exchange(history, deployment=deployment), history, 300
    )
    assert summary_sections(summary)["SESSION INTENT"] == GOAL
    assert [r.status for r in sim.requests] == [400, 200]
    first, second = (len(r.body["messages"][1]["content"]) for r in sim.requests)
    assert first < fit_to(2_048, 300).transcript_chars  # all of it fitted our estimate
    assert second < 0.6 * first
