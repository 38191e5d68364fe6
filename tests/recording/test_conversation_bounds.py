"""A call's conversation is bounded whatever the client sent: a message of thousands of
parts, a tool name of a megabyte and a huge answer each come out within a few tens of KB, cut
with a marker that says where the whole is."""

from __future__ import annotations

import orjson

from proxy.recording.conversation import (
    ANSWER_CHARS,
    MESSAGES_CHARS,
    MESSAGES_SHOWN,
    bounded,
    bounded_answer,
    message,
    text,
    tool_call,
)


def test_many_parts_a_huge_name_and_a_long_history_stay_within_the_bounds() -> None:
    huge, long = "n" * 1_000_000, "y" * 50_000  # one string each, held by every part
    parts = [tool_call(huge, huge, {"x": long}) for _ in range(5_000)]
    old = "old " * 10_000
    messages = [message("user", [text(old)]) for _ in range(500)]
    messages.append(message("assistant", parts))
    shown, omitted = bounded(messages)
    size = len(orjson.dumps(shown))
    assert size < 2 * MESSAGES_CHARS + 64 * 1_000, size
    assert omitted == 501 - len(shown) and len(shown) <= MESSAGES_SHOWN
    last = shown[-1]["parts"]
    assert len(last) == 65 and last[-1]["kind"].startswith("4,936 more parts")
    assert len(last[0]["name"]) < 300 and "?full=1" in last[0]["name"]
    assert "?full=1" in last[0]["arguments"]  # its JSON, cut


def test_a_huge_answer_is_cut_with_a_marker() -> None:
    answer = message("assistant", [text("z" * 1_000_000)])
    answer["stop"] = "end_turn"
    shown = bounded_answer(answer)
    assert shown is not None and shown["stop"] == "end_turn"
    said = shown["parts"][0]["text"]
    assert len(said) < ANSWER_CHARS and said.endswith("?full=1 for all of it]")
