"""What a Responses turn leaves the session's next: its memory across turns.

The next turn's view lends the view messages this one built for the input items the two share,
up to the last message boundary in them, and maps only the rest (proxy/wire/responses/view.py:
ResponsesView.of). The record holds no more than that lending reads; it lives in the session's
TurnMemory (proxy/sessions/turn_memory.py), under the owner's key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.messages import Message


@dataclass(slots=True, frozen=True)
class ResponsesMemory:
    instructions: Any  # the turn's instructions, as sent
    instructions_message: Message | None  # ...and their view message
    items: list[dict[str, Any]]  # the turn's input, as a list
    built: list[Message]  # its view as built, before any stage saw it
    ends: list[tuple[int, int]]  # (items mapped, built's length) at each message boundary
    origins: dict[int, list[int]]  # by id() of a view message: its items' indexes
    minted: dict[int, int]  # the proxy's compaction items: view message id() -> item index
    calls: dict[str, int]  # call_id -> its call item's index
    outputs: dict[str, int]  # call_id -> its output's index
    repeated_ids: bool  # a call_id seen twice: the index maps cannot be lent
    compaction_at: int  # the input's first compaction item (-1: none)
    turn: object  # the turn's token (exchange.NativePrefix.turn)
