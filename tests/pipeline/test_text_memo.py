"""TextMemo: a pure function's results remembered by digest, never the texts themselves."""

from __future__ import annotations

import sys

from proxy.pipeline.text_memo import TextMemo


def test_it_answers_as_the_function_and_computes_each_text_once() -> None:
    calls: list[tuple[str, str]] = []

    def length(tag: str, text: str) -> int:
        calls.append((tag, text))
        return len(tag) + len(text)

    memo = TextMemo(length)
    assert memo("", "abc") == 3 and memo("", "abc") == 3
    assert memo("ab", "c") == 3 and memo("a", "bc") == 3  # the tag is part of the key
    assert calls == [("", "abc"), ("ab", "c"), ("a", "bc")]


def test_it_keeps_no_text_alive() -> None:
    memo = TextMemo(lambda tag, text: len(text))
    text = "".join(["{", '"path": "src/a.py"', "}"])  # a fresh object, as a parse makes
    before = sys.getrefcount(text)
    assert memo("read", text) == len(text)
    assert sys.getrefcount(text) == before


def test_it_is_bounded_and_long_texts_are_not_remembered() -> None:
    memo = TextMemo(lambda tag, text: len(text), max_chars=10, max_entries=4)
    for n in range(9):
        memo("", str(n))
        assert len(memo) <= 4
    size = len(memo)
    assert memo("", "x" * 11) == 11
    assert memo("t" * 8, "xyz") == 3  # a long tag is not kept either
    assert len(memo) == size
