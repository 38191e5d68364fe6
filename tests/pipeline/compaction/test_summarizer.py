"""The summarizer: its bounded transcript, and its request as a child exchange of the
request it summarizes for (its route-level behaviour: tests/routes/test_summarizer.py)."""

from __future__ import annotations

import pytest

from proxy.pipeline.compaction.summarizer import render_transcript, summary_exchange
from proxy.policies.spec import CompactionSpec, Policy
from tests.pipeline.compaction.factories import GOAL, coding_session, exchange, user

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
    ex.owner, ex.parent_session, ex.recovery.deadline = "key:a", "key:a/parent", 123.0
    child = summary_exchange(ex)
    assert (child.session, child.owner) == (ex.session, "key:a")
    assert child.parent_session == "key:a/parent"
    assert (child.request_id, child.key, child.started) == (ex.request_id, ex.key, ex.started)
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
