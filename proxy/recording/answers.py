"""An answer as its client got it, in the wire's non-streamed shape: a JSON body as it is, a
stream (the bytes the relay wrote) assembled into the reply it stands for. Reads plain parsed
events and hands them to the wire's own assembly (its `Wire.answer_assembly`); imports no wire
format.

Assembly is linear in the stream's bytes (text pieces are collected and joined once, never
concatenated one by one), and `answer_in_slices` does it in slices of at most SLICE_S of the
event loop's time: a stream as long as the recording bound allows holds the loop a few ms at a
time, never for the whole stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import orjson

SLICE_S = 0.002  # the longest the slices hold the event loop (checked every CHECK_EVERY events)
CHECK_EVERY = 32


def answer_of(assemble: Assemble, body: bytes | None, streamed: list[bytes] | None) -> Any:
    """The answer's native non-streamed form, or None when there was none to read (at once:
    for answers short enough not to matter, see `answer_in_slices`)."""
    if streamed:
        return _assemble(assemble, streamed)
    if not body:
        return None
    if body.lstrip()[:1] in (b"{", b"["):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
    return _assemble(assemble, (body,))  # a whole answer sent as its wire's event stream


async def answer_in_slices(
    assemble: Assemble, body: bytes | None, streamed: list[bytes] | None
) -> Any:
    """`answer_of`, yielding to the event loop whenever a slice took SLICE_S."""
    if not streamed and (not body or body.lstrip()[:1] in (b"{", b"[")):
        return answer_of(assemble, body, streamed)
    assembly = assemble()
    began = time.perf_counter()
    for count, block in enumerate(_blocks(streamed or (body or b"",))):
        event = _event(block)
        if event is not None:
            assembly.add(event)
        if count % CHECK_EVERY == 0 and time.perf_counter() - began > SLICE_S:
            await asyncio.sleep(0)
            began = time.perf_counter()
    return assembly.answer()


def assembled_size(body: bytes | None, streamed: list[bytes] | None) -> int:
    """The bytes an answer's assembly reads: a stream's (a JSON body is only parsed, in C)."""
    if streamed:
        return sum(map(len, streamed))
    if body and body.lstrip()[:1] not in (b"{", b"["):
        return len(body)
    return 0


def _assemble(assemble: Assemble, chunks: Iterable[bytes]) -> dict[str, Any] | None:
    assembly = assemble()
    for block in _blocks(chunks):
        event = _event(block)
        if event is not None:
            assembly.add(event)
    return assembly.answer()


def _event(block: bytes) -> dict[str, Any] | None:
    """An SSE event's JSON data; None for `[DONE]` and anything unparsable."""
    payload = b"\n".join(
        line[5:].lstrip() for line in block.split(b"\n") if line.startswith(b"data:")
    )
    if not payload or payload == b"[DONE]":
        return None
    try:
        event = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def _blocks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The blank-line-separated blocks of the chunks' bytes, each read once (a block split
    over many chunks is not searched again from its start)."""
    pending = bytearray()
    for chunk in chunks:
        scan = max(len(pending) - 1, 0)  # a separator may straddle the chunks
        pending += chunk
        start = 0
        while (end := pending.find(b"\n\n", scan)) >= 0:
            yield bytes(pending[start:end])
            start = scan = end + 2
        del pending[:start]  # bytearray drops its head without copying the rest
    if pending:
        yield bytes(pending)


class AnswerAssembly(Protocol):
    """A wire's streamed answer put back together, one parsed event at a time (each wire's
    answer.py: its `Wire.answer_assembly`)."""

    def add(self, event: dict[str, Any]) -> None: ...

    def answer(self) -> dict[str, Any] | None:
        """The non-streamed answer the events stand for; None when none began."""
        ...


Assemble = Callable[[], AnswerAssembly]  # a fresh assembly of one wire's answers


class Texts:
    """Text pieces collected for their fields, joined once at the end: `into[name]` becomes
    the join of its pieces (the field keeps its place in `into`)."""

    def __init__(self) -> None:
        self._pieces: dict[tuple[int, str], tuple[dict[str, Any], list[str]]] = {}

    def append(self, into: dict[str, Any], name: str, piece: str) -> None:
        found = self._pieces.get((id(into), name))
        if found is None:
            before = into.get(name)
            into[name] = None  # its place, in the order the fields came
            text = before if isinstance(before, str) else ""
            found = self._pieces[(id(into), name)] = (into, [text])
        found[1].append(piece)

    def drop(self, into: dict[str, Any], name: str) -> None:
        """The field was set whole: its pieces so far are gone."""
        self._pieces.pop((id(into), name), None)

    def join(self) -> None:
        for (_, name), (into, pieces) in self._pieces.items():
            into[name] = "".join(pieces)
        self._pieces.clear()
