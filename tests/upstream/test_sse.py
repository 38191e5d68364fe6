"""The SSE splitter: events whole and in order however the bytes are cut, in linear time, and
an event over the cap refused as soon as it passes it."""

from __future__ import annotations

import time

import pytest

from proxy.upstream.sse import EventTooLarge, SSESplitter

STREAM = b"data: one\n\ndata: two\nid: 2\n\n\n\ndata: three\n\n: comment\n\ndata: [DONE]\n\n"
EVENTS = [b"data: one", b"data: two\nid: 2", b"data: three", b": comment", b"data: [DONE]"]


def split_all(chunks: list[bytes], cap: int = 1 << 20) -> list[bytes]:
    splitter = SSESplitter(cap)
    events = [event for chunk in chunks for event in splitter.feed(chunk)]
    rest = splitter.rest()
    return [*events, rest] if rest else events


@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64])
def test_events_come_out_whole_however_the_stream_is_cut(size: int, crlf: bool) -> None:
    stream = STREAM.replace(b"\n", b"\r\n") if crlf else STREAM
    chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
    assert split_all(chunks) == EVENTS


def test_a_separator_split_between_two_chunks_ends_the_event() -> None:
    splitter = SSESplitter(1024)
    assert splitter.feed(b"data: a\n") == []
    assert splitter.feed(b"\ndata: b\r") == [b"data: a"]
    assert splitter.feed(b"\n\r") == []
    assert splitter.feed(b"\n") == [b"data: b"]


def test_a_last_event_without_its_blank_line_is_kept_for_the_end() -> None:
    splitter = SSESplitter(1024)
    assert splitter.feed(b"data: a\n\ndata: b\n") == [b"data: a"]
    assert splitter.rest() == b"data: b"


def test_an_event_over_the_cap_is_refused_once_it_passes_it() -> None:
    splitter = SSESplitter(100)
    assert splitter.feed(b"data: " + b"x" * 90) == []
    with pytest.raises(EventTooLarge) as caught:
        splitter.feed(b"x" * 10)
    assert caught.value.size == 106 and caught.value.limit == 100


def test_a_whole_event_over_the_cap_in_one_chunk_is_refused() -> None:
    with pytest.raises(EventTooLarge):
        SSESplitter(100).feed(b"data: " + b"x" * 200 + b"\n\n")


def test_an_event_at_the_cap_passes() -> None:
    event = b"data: " + b"x" * 94
    assert SSESplitter(100).feed(event[:50]) == []
    splitter = SSESplitter(100)
    splitter.feed(event[:50])
    assert splitter.feed(event[50:] + b"\n\n") == [event]


def test_a_long_event_in_small_chunks_costs_linear_time() -> None:
    """32 MiB in 4 KiB chunks without a separator: a whole-buffer scan per chunk would be
    ~2^40 bytes of work; scanning only the new bytes is 32 MiB."""
    splitter = SSESplitter(64 << 20)
    chunk = b"y" * 4096
    started = time.perf_counter()
    for _ in range(8192):
        assert splitter.feed(chunk) == []
    assert splitter.feed(b"\n\n") == [b"y" * (32 << 20)]
    assert time.perf_counter() - started < 1.0
