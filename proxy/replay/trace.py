"""The trace: one turn a line, in the shape recordings read back as (the `recorded_turns` of
proxy/recording/): `wire`, `request` (the client's native body), optionally `answer` (the
upstream's native non-streamed answer), `route`, `model`, `events`, `usage`... Checked here,
so a bad line is named by its number before anything runs."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

ROUTES = {
    "chat": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "responses": "/v1/responses",
}
MAX_LINE_BYTES = 64 * 1024 * 1024  # one turn; a real history is well under this


class TraceError(Exception):
    """A trace that cannot be replayed; the message names the line."""


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    try:
        with open(path, "rb") as file:
            lines = [(n, line) for n, line in enumerate(file, 1) if line.strip()]
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    turns = []
    for number, line in lines:
        where = f"{path}:{number}"
        if len(line) > MAX_LINE_BYTES:
            raise TraceError(f"{where}: a line longer than {MAX_LINE_BYTES} bytes")
        try:
            turn = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise TraceError(f"{where}: not JSON ({exc})") from None
        turns.append(check_turn(turn, where))
    if not turns:
        raise TraceError(f"{path}: no turns")
    return turns


def check_turns(turns: Iterable[Any], source: str) -> list[dict[str, Any]]:
    """Turns read back from a store, checked like a file's lines (numbered from 1)."""
    checked = [check_turn(turn, f"{source}: turn {n}") for n, turn in enumerate(turns, 1)]
    if not checked:
        raise TraceError(f"{source}: no turns")
    return checked


def check_turn(turn: Any, where: str) -> dict[str, Any]:
    if not isinstance(turn, dict):
        raise TraceError(f"{where}: a turn is a JSON object")
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
    if not isinstance(request.get("model"), str) or not request["model"]:
        raise TraceError(f"{where}: the request names no model")
    answer = turn.get("answer")
    if answer is not None and not isinstance(answer, dict):
        raise TraceError(f'{where}: "answer" must be the upstream\'s JSON answer (an object)')
    return turn
