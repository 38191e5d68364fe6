"""An answer as its client got it, in the wire's non-streamed shape: a JSON body as it is, a
stream (the bytes the relay wrote) assembled into the reply it stands for. Reads plain parsed
events; imports no wire format.

Assembly is linear in the stream's bytes (text pieces are collected and joined once, never
concatenated one by one), and `answer_in_slices` does it in slices of at most SLICE_S of the
event loop's time: a stream as long as the recording bound allows holds the loop a few ms at a
time, never for the whole stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

SLICE_S = 0.002  # the longest the slices hold the event loop (checked every CHECK_EVERY events)
CHECK_EVERY = 32


def answer_of(wire: str, body: bytes | None, streamed: list[bytes] | None) -> Any:
    """The answer's native non-streamed form, or None when there was none to read (at once:
    for answers short enough not to matter, see `answer_in_slices`)."""
    if streamed:
        return _assemble(wire, streamed)
    if not body:
        return None
    if body.lstrip()[:1] in (b"{", b"["):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
    return _assemble(wire, (body,))  # a whole answer sent as its wire's event stream


async def answer_in_slices(wire: str, body: bytes | None, streamed: list[bytes] | None) -> Any:
    """`answer_of`, yielding to the event loop whenever a slice took SLICE_S."""
    if not streamed and (not body or body.lstrip()[:1] in (b"{", b"[")):
        return answer_of(wire, body, streamed)
    assembly = _assembly(wire)
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


def _assemble(wire: str, chunks: Iterable[bytes]) -> dict[str, Any] | None:
    assembly = _assembly(wire)
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


class _Assembly:
    def add(self, event: dict[str, Any]) -> None:
        raise NotImplementedError

    def answer(self) -> dict[str, Any] | None:
        raise NotImplementedError


def _assembly(wire: str) -> _Assembly:
    if wire == "anthropic":
        return _Anthropic()
    if wire == "responses":
        return _Responses()
    if wire == "gemini":  # its assembly lives with its wire (imported here only when needed)
        from proxy.wire.gemini.replies import Assembly

        return Assembly()  # type: ignore[return-value]
    return _Chat()


class _Texts:
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


class _Chat(_Assembly):
    def __init__(self) -> None:
        self.first: dict[str, Any] | None = None
        self.usage: Any = None
        self.error: Any = None
        self.choices: dict[int, dict[str, Any]] = {}
        self.texts = _Texts()

    def add(self, event: dict[str, Any]) -> None:
        if self.first is None:
            self.first = event
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        if "error" in event:
            self.error = event["error"]
        for choice in event.get("choices") or ():
            index = choice.get("index", 0)
            into = self.choices.get(index)
            if into is None:
                into = self.choices[index] = {
                    "index": index,
                    "message": {"role": "assistant", "content": None},
                    "finish_reason": None,
                }
            self._delta(into["message"], choice.get("delta") or {})
            if choice.get("finish_reason") is not None:
                into["finish_reason"] = choice["finish_reason"]

    def _delta(self, message: dict[str, Any], delta: dict[str, Any]) -> None:
        for name, value in delta.items():
            if name == "tool_calls":
                calls = message.setdefault("tool_calls", [])
                for piece in value or ():
                    index = piece.get("index", len(calls))
                    while len(calls) <= index:
                        calls.append({"id": None, "type": "function",
                                      "function": {"name": "", "arguments": ""}})  # fmt: skip
                    call = calls[index]
                    if piece.get("id"):
                        call["id"] = piece["id"]
                    function = piece.get("function") or {}
                    for part in ("name", "arguments"):
                        if isinstance(function.get(part), str):
                            self.texts.append(call["function"], part, function[part])
            elif isinstance(value, str) and name != "role":
                self.texts.append(message, name, value)
            elif value is not None:
                self.texts.drop(message, name)
                message[name] = value

    def answer(self) -> dict[str, Any] | None:
        if self.first is None:
            return None
        self.texts.join()
        first = self.first
        answer: dict[str, Any] = {
            "id": first.get("id"),
            "object": "chat.completion",
            "created": first.get("created"),
            "model": first.get("model"),
            "choices": [self.choices[i] for i in sorted(self.choices)],
        }
        if self.usage is not None:
            answer["usage"] = self.usage
        if self.error is not None:
            answer["error"] = self.error
        return answer


class _Anthropic(_Assembly):
    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self.partial: dict[int, list[str]] = {}
        self.texts = _Texts()

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        message = self.message
        if kind == "message_start":
            self.message = dict(event.get("message") or {})
            self.message["content"] = list(self.message.get("content") or [])
            self.partial.clear()
            self.texts = _Texts()
        elif message is None:
            return
        elif kind == "content_block_start":
            index = event.get("index", len(message["content"]))
            while len(message["content"]) <= index:
                message["content"].append({})
            message["content"][index] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            index = event.get("index", 0)
            if index >= len(message["content"]):
                return
            block, delta = message["content"][index], event.get("delta") or {}
            for name in ("text", "thinking", "signature"):
                if isinstance(delta.get(name), str):
                    self.texts.append(block, name, delta[name])
            if "partial_json" in delta:
                self.partial.setdefault(index, []).append(delta["partial_json"])
        elif kind == "message_delta":
            message.update(event.get("delta") or {})
            if isinstance(event.get("usage"), dict):
                message["usage"] = {**(message.get("usage") or {}), **event["usage"]}
        elif kind == "error":
            message["error"] = event.get("error")

    def answer(self) -> dict[str, Any] | None:
        message = self.message
        if message is None:
            return None
        self.texts.join()
        for index, pieces in self.partial.items():
            text = "".join(pieces)
            try:
                message["content"][index]["input"] = orjson.loads(text) if text else {}
            except orjson.JSONDecodeError:
                message["content"][index]["input"] = text
        return message


class _Responses(_Assembly):
    def __init__(self) -> None:
        self.last: dict[str, Any] | None = None

    def add(self, event: dict[str, Any]) -> None:
        response = event.get("response")
        if isinstance(response, dict):
            self.last = response  # created, in_progress, then completed: the final one wins
        elif event.get("type") == "error" and self.last is not None:
            self.last = {**self.last, "error": event.get("error") or event}

    def answer(self) -> dict[str, Any] | None:
        return self.last
