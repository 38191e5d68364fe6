"""Which client turn (a person's prompt) each call of a trace belongs to, counted as the
recording counts it: a recorded call's own `turn` and `opens` (and `side`) when it has them;
else (a hand-written trace, an older recording) the wire's Conversation reads the entries new
in the call, those past the prefix it shares with the call before it (`opens_in`), and a side
call (sessions/main_line.py: `MainLine`) opens none."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.recording.conversation import opening, opens_in
from proxy.sessions.main_line import MainLine
from proxy.wire.registry import WIRES

JSON = dict[str, Any]
_CONVERSATIONS = {wire.name: wire.conversation for wire in WIRES}
_LIST_KEYS = ("messages", "input", "contents")  # where a request keeps its entries


def numbered(calls: Sequence[JSON]) -> list[JSON]:
    """The calls, each with `turn` (its client turn, from 1), `opens` (whether it opens it)
    and `side` (whether it is a side call); a call that has `turn` and `opens` keeps them.
    The first call always opens a turn."""
    out: list[JSON] = []
    turn, previous = 0, None
    line = MainLine()
    for call in calls:
        items = _entries(call)
        opens = call.get("opens")
        side = call.get("side") is True
        if not isinstance(opens, bool):
            given = call.get("turn")
            if isinstance(given, int) and turn:
                opens = given != turn
            else:
                opens, side = _opens(call, items, previous, line, first=not turn)
        given = call.get("turn")
        opens = opens or (not turn and not isinstance(given, int))  # the first opens one
        turn = given if isinstance(given, int) else turn + opens
        out.append({**call, "turn": turn, "opens": opens, "side": side})
        previous = items
    return out


def _entries(call: JSON) -> list[Any] | None:
    request = call.get("request")
    if not isinstance(request, dict):
        return None
    return next((request[k] for k in _LIST_KEYS if isinstance(request.get(k), list)), None)


def _opens(
    call: JSON, items: list[Any] | None, previous: list[Any] | None, line: MainLine, first: bool
) -> tuple[bool, bool]:
    """Whether the call opens a client turn, and is a side call. A body without a list is a
    prompt of its own."""
    conversation = _CONVERSATIONS.get(call.get("wire", ""))
    if items is None or conversation is None:
        return True, False
    shared = 0
    for mine, theirs in zip(items, previous or (), strict=False):
        if mine != theirs:
            break
        shared += 1
    request = call["request"]
    side = line.side(shared > 0, lambda: opening(conversation, request, items))
    return first or (not side and opens_in(conversation, items, shared)), side
