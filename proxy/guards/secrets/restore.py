"""The secrets given back: where the model's answer carries a placeholder (proxy/guards/secrets/
placeholders.py), the client gets the secret it stands for, in a whole answer (its JSON bytes)
and in a stream (event by event, a placeholder split across two events included).

Wire-agnostic: a placeholder only ever stands inside a JSON string, so a whole answer is one
substitution over its bytes, and a stream event is parsed only when it holds a guillemet (or
its escape) or the event before it ended on what could begin a placeholder. That event is
held back until the next one: when the next carries a string at the same place (the same
delta field), the piece moves there and the two are restored as one text; else the held event
goes out as it came.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy.guards.secrets.placeholders import IN_JSON, IN_TEXT, partial_tail

# A whole answer's bytes before, kept on its response for the recording.
UNRESTORED = web.ResponseKey("agentproxy_unrestored", bytes)
_MARKS = (b"\xc2\xab", b"\\u00")  # a guillemet, or an escape that may be one
Path = tuple[str | int, ...]
# What the provider verifies when it comes back (thinking and its signature, encrypted
# reasoning, Gemini's thought signatures, redacted thinking): left as the model wrote it.
SIGNED = frozenset({"thinking", "signature", "encrypted_content", "thoughtSignature", "data"})


def restore_bytes(body: bytes, secrets: Mapping[str, str]) -> bytes:
    """A whole answer (JSON, or its wire's events) with every known placeholder replaced by
    its secret, signed reasoning left as it came."""
    if b"secret:" not in body:
        return body
    if body.lstrip()[:1] not in (b"{", b"["):
        restorer = StreamRestorer(secrets)
        return restorer.feed(body) + restorer.end()
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return restore_in_json(body, secrets)
    changed = False
    for path, text in list(_strings(data, ())):
        restored = restore_text(text, secrets)
        if restored != text:
            _put(data, path, restored)
            changed = True
    return orjson.dumps(data) if changed else body


def restore_in_json(raw: bytes, secrets: Mapping[str, str]) -> bytes:
    """Placeholders replaced in JSON text as it stands, each secret JSON-escaped (what cannot
    be parsed; an object's arguments as the tool-call rules read them)."""

    def secret(match: Any) -> bytes:
        found = secrets.get(f"«secret:{match.group(1).decode()}»")
        return match.group(0) if found is None else orjson.dumps(found)[1:-1]

    return IN_JSON.sub(secret, raw)


def restore_text(text: str, secrets: Mapping[str, str]) -> str:
    if "«secret:" not in text:
        return text
    return IN_TEXT.sub(lambda m: secrets.get(m.group(0), m.group(0)), text)


@dataclass(slots=True)
class _Event:
    lines: list[bytes]  # the event's lines
    at: int  # which of them is the data line
    data: Any  # the data line's JSON, parsed


@dataclass(slots=True)
class _Held:
    event: _Event
    path: Path
    head: str
    tail: str


class StreamRestorer:
    """One stream's events in, the client's out (at most one event late)."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self.secrets = secrets
        self._held: _Held | None = None

    def feed(self, data: bytes) -> bytes:
        if self._held is None and not any(mark in data for mark in _MARKS):
            return data  # the common event: nothing to look at
        out = bytearray()
        for chunk in data.split(b"\n\n"):
            if chunk.strip():
                out += self._event(chunk)
        return bytes(out)

    def end(self) -> bytes:
        """The held event, if any, as it came (the stream ended without the rest)."""
        held, self._held = self._held, None
        if held is None:
            return b""
        _put(held.event.data, held.path, held.head + held.tail)
        return _framed(held.event)

    def _event(self, chunk: bytes) -> bytes:
        event = _parsed(chunk)
        if event is None:
            return self.end() + restore_in_json(chunk, self.secrets) + b"\n\n"
        out = b""
        held, self._held = self._held, None
        if held is not None:
            value = _get(event.data, held.path)
            if isinstance(value, str):
                _put(held.event.data, held.path, held.head)
                _put(event.data, held.path, held.tail + value)
            else:
                _put(held.event.data, held.path, held.head + held.tail)
            out = _framed(held.event)
        for path, text in list(_strings(event.data, ())):
            restored = restore_text(text, self.secrets)
            at = partial_tail(restored)
            if at >= 0 and self._held is None:
                self._held = _Held(event, path, restored[:at], restored[at:])
                restored = restored[:at]
            if restored is not text:
                _put(event.data, path, restored)
        if self._held is not None and self._held.event is event:
            return out
        return out + _framed(event)


def _parsed(chunk: bytes) -> _Event | None:
    lines = chunk.split(b"\n")
    for index, line in enumerate(lines):
        if line.startswith(b"data:"):
            try:
                data = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                return None
            if not isinstance(data, dict | list):
                return None
            return _Event(lines, index, data)
    return None


def _framed(event: _Event) -> bytes:
    lines = list(event.lines)
    lines[event.at] = b"data: " + orjson.dumps(event.data)
    return b"\n".join(lines) + b"\n\n"


def _strings(value: Any, path: Path) -> Iterator[tuple[Path, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in SIGNED:
                yield from _strings(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, (*path, index))


def _get(value: Any, path: Path) -> Any:
    for step in path:
        if isinstance(value, dict) and isinstance(step, str):
            value = value.get(step)
        elif isinstance(value, list) and isinstance(step, int) and step < len(value):
            value = value[step]
        else:
            return None
    return value


def _put(value: Any, path: Path, text: str) -> None:
    container = _get(value, path[:-1])
    container[path[-1]] = text
