"""The trace: one model call a line, in the shape recordings read back as (the
`recorded_turns` of proxy/recording/): `wire`, `request` (the client's native body),
optionally `answer` (the upstream's native non-streamed answer), `status` (what the client got
live), `headers` (the client's protocol headers), `turn`, `opens` and `side` (its client
turn, whether it opens it, whether it is a side call), `route`, `model`, `events`,
`usage`... Checked here, so a bad line is named by its number before anything runs."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from proxy.wire.registry import WIRES

# A turn is replayed on its wire's model route (a wire whose route names the model: none).
ROUTES = {wire.name: wire.model_route for wire in WIRES if wire.model_route is not None}
MAX_LINE_BYTES = 64 * 1024 * 1024  # one turn; a real history is well under this
MAX_TRACE_BYTES = 1024 * 1024 * 1024  # a whole trace: what a replay may hold in memory
CHUNK_BYTES = 1024 * 1024  # read at a time: a line past the limit is refused, never held whole
# Headers a trace may not name: replay sends its own key, session and body.
REPLAYS_OWN_HEADERS = frozenset(
    ("authorization", "x-api-key", "x-goog-api-key", "api-key", "cookie", "host",
     "content-length", "content-type", "transfer-encoding", "connection")
)  # fmt: skip
# A model name goes into response headers and configuration: no control characters.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class TraceError(Exception):
    """A trace that cannot be replayed; the message names the line."""


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """The turns of a JSON-lines file, read a chunk at a time: a line past MAX_LINE_BYTES, a
    file past MAX_TRACE_BYTES, or one that is not text (a NUL byte, not UTF-8: a binary file,
    /dev/zero) is refused as soon as it is seen, without reading on."""
    turns = []
    try:
        with open(path, "rb") as file:
            for number, line in _lines(file, str(path)):
                where = f"{path}:{number}"
                try:
                    turn = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise TraceError(f"{where}: {_not_json(line, exc)}") from None
                turns.append(check_turn(turn, where))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not turns:
        raise TraceError(f"{path}: no calls")
    return turns


def _not_json(line: bytes, exc: orjson.JSONDecodeError) -> str:
    try:
        line.decode()
    except UnicodeDecodeError as bad:  # a binary file: its bytes say nothing to the user
        return f"not a text file (not UTF-8 at byte {bad.start}): a trace is JSON lines"
    return f"not JSON ({exc})"


def _lines(file: IO[bytes], path: str) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines, numbered from 1, each checked for size and text as it is read."""
    number, total = 0, 0
    while True:
        number += 1
        parts: list[bytes] = []  # joined once whole: a refused line is never copied
        size = 0
        while not (parts and parts[-1].endswith(b"\n")):
            part = file.readline(CHUNK_BYTES)
            if not part:
                break
            if b"\0" in part:
                raise TraceError(f"{path}:{number}: not a text file (a NUL byte): a trace is "
                                 "JSON lines")  # fmt: skip
            size, total = size + len(part), total + len(part)
            if size > MAX_LINE_BYTES:
                raise TraceError(f"{path}:{number}: a line longer than {MAX_LINE_BYTES} bytes")
            if total > MAX_TRACE_BYTES:
                raise TraceError(f"{path}: longer than {MAX_TRACE_BYTES} bytes")
            parts.append(part)
        if not parts:
            return
        line = parts[0] if len(parts) == 1 else b"".join(parts)
        if line.strip():
            yield number, line


def check_turns(turns: Iterable[Any], source: str) -> list[dict[str, Any]]:
    """Turns read back from a store, checked like a file's lines (numbered from 1)."""
    checked = [check_turn(turn, f"{source}: call {n}") for n, turn in enumerate(turns, 1)]
    if not checked:
        raise TraceError(f"{source}: no calls")
    return checked


def check_turn(turn: Any, where: str) -> dict[str, Any]:
    if not isinstance(turn, dict):
        raise TraceError(f"{where}: a call is a JSON object")
    wire = turn.get("wire")
    if wire not in ROUTES:
        raise TraceError(
            f"{where}: unknown wire {wire!r}; one of {', '.join(ROUTES)}"
            if wire is not None
            else f'{where}: no "wire" ({", ".join(ROUTES)})'
        )
    route = turn.get("route", ROUTES[wire])
    if route != ROUTES[wire]:
        raise TraceError(f"{where}: route {route!r} is not the {wire} wire's ({ROUTES[wire]})")
    request = turn.get("request")
    if not isinstance(request, dict):
        raise TraceError(f'{where}: "request" must be the client\'s JSON body (an object)')
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise TraceError(f"{where}: the request names no model")
    if control := _CONTROL.search(model):
        raise TraceError(
            f"{where}: the request's model name holds a control character "
            f"(U+{ord(control.group()):04X}): {model[:80]!r}"
        )
    answer = turn.get("answer")
    if answer is not None and not isinstance(answer, dict):
        raise TraceError(f'{where}: "answer" must be the upstream\'s JSON answer (an object)')
    status = turn.get("status")
    if status is not None and not (type(status) is int and 100 <= status <= 599):
        raise TraceError(f'{where}: "status" must be the HTTP status the client got (100-599)')
    number = turn.get("turn")
    if number is not None and not (type(number) is int and number >= 1):
        raise TraceError(f'{where}: "turn" must be the client turn\'s number (1 or more)')
    for flag in ("opens", "side"):
        if flag in turn and type(turn[flag]) is not bool:
            raise TraceError(f'{where}: "{flag}" must be true or false')
    _check_headers(turn.get("headers"), where)
    return turn


def _check_headers(headers: Any, where: str) -> None:
    """The client's protocol headers: strings, none of those replay sets itself (its key, its
    session, the body's length and type) nor any other credential."""
    if headers is None:
        return
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise TraceError(f'{where}: "headers" must map header names to strings')
    for name, value in headers.items():
        lowered = name.lower()
        if lowered in REPLAYS_OWN_HEADERS or lowered.startswith("x-agentproxy-"):
            raise TraceError(f"{where}: header {name!r} is replay's own to send")
        if _CONTROL.search(name + value) or not name:
            raise TraceError(f"{where}: header {name[:80]!r} holds a control character")
