"""The session's intent, kept verbatim beside every summary."""

from __future__ import annotations

from proxy.messages import Message
from proxy.pipeline.compaction.budget import message_tokens
from proxy.pipeline.compaction.intent import INTENT_HEADER, intent_of
from tests.pipeline.compaction.factories import call, result, user

BODY: Message = {"role": "user", "content": "[agentproxy] Earlier conversation summarized ..."}


def test_the_first_user_message_is_the_intent_by_default_the_very_same_dict() -> None:
    goal = user("GOAL: fix the parser")
    raw = [call("c1", "read_file"), result("c1", "x"), goal, user("and then?")]
    assert intent_of([], raw, None, 8_000, "ap_1")[0] is goal
    assert intent_of([], [call("c1", "f"), result("c1", "x")], None, 8_000, "ap_1") == []


def test_an_earlier_replacement_carries_its_intent_forward_as_it_is() -> None:
    goal = user("GOAL: fix the parser")
    previous = [goal, BODY]
    assert intent_of(previous, [user("later")], None, 8_000, "ap_2") == [goal]
    assert intent_of([BODY], [user("later")], None, 8_000, "ap_2") == []  # a body alone


def test_a_pattern_gathers_its_lines_each_once_and_adds_later_ones() -> None:
    raw = [user("hello\nGOAL: fix the parser\nthanks"), user("GOAL: fix the parser")]
    first = intent_of([], raw, "^GOAL:.*", 8_000, "ap_1")
    assert first == [{"role": "user", "content": f"{INTENT_HEADER}\nGOAL: fix the parser"}]
    later = [user("also GOAL: keep the API\nGOAL: keep the tests green")]
    second = intent_of([*first, BODY], later, "GOAL:.*", 8_000, "ap_2")
    assert second[0]["content"].splitlines() == [
        INTENT_HEADER, "GOAL: fix the parser", "GOAL: keep the API", "GOAL: keep the tests green",
    ]  # fmt: skip
    nothing = [user("no goal line here")]
    assert intent_of([], nothing, "^GOAL:.*", 8_000, "ap_3") == nothing  # the first message


def test_an_intent_too_large_for_the_window_keeps_its_start_and_end() -> None:
    huge = user("GOAL: start here. " + "filler " * 3_000 + "END: the deadline is Friday.")
    [kept] = intent_of([], [huge], None, 4_000, "ap_9")
    assert message_tokens(kept) <= 0.15 * 4_000
    text = kept["content"]
    assert text.startswith("GOAL: start here.") and text.endswith("the deadline is Friday.")
    assert "it is archived in full as ap_9" in text
