"""The pairing validator and hashes that every rewrite stage relies on."""

from __future__ import annotations

from proxy.messages import (
    estimate_tokens,
    message_hash,
    pairing_problems,
    prefix_hashes,
)


def call(*ids: str) -> dict[str, object]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
        ],
    }


def result(call_id: str) -> dict[str, object]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


USER = {"role": "user", "content": "hi"}


def kinds(messages: list[dict[str, object]]) -> list[tuple[int, str, str]]:
    return [(p.index, p.kind, p.tool_call_id) for p in pairing_problems(messages)]


def test_valid_histories_have_no_problems() -> None:
    assert kinds([USER, call("a", "b"), result("b"), result("a"), USER]) == []
    assert kinds([USER, call("a"), result("a"), call("b"), result("b")]) == []


def test_each_kind_of_problem_is_found() -> None:
    assert kinds([USER, call("a", "b"), result("a"), USER]) == [(1, "unanswered", "b")]
    assert kinds([USER, result("x")]) == [(1, "orphan", "x")]
    assert kinds([call("a"), result("a"), result("a")]) == [(2, "duplicate", "a")]
    assert kinds([call("a"), result("b"), result("a")]) == [(1, "orphan", "b")]
    # A result separated from its call by another message answers nothing.
    assert kinds([call("a"), USER, result("a")]) == [(0, "unanswered", "a"), (2, "orphan", "a")]


def test_hashes_ignore_key_order_and_roll_over_the_prefix() -> None:
    assert message_hash({"role": "user", "content": "x"}) == message_hash(
        {"content": "x", "role": "user"}
    )
    first = prefix_hashes([USER, call("a")])
    longer = prefix_hashes([USER, call("a"), result("a")])
    assert longer[:2] == first
    assert prefix_hashes([result("a"), USER])[1] != prefix_hashes([USER, result("a")])[1]


def test_token_estimate_counts_content_and_tool_calls() -> None:
    assert estimate_tokens({"role": "user", "content": "x" * 400}) == 104
    assert estimate_tokens(call("a")) > estimate_tokens({"role": "assistant", "content": ""})
