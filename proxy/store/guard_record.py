"""The guards' per-session facts in one state entry: the loop the session is stuck in
(pipeline/loops.py) and its failing streak (control/sessions.py). A turn reads it once,
whichever guard asks first, and a guard that changes its part writes the entry back whole.

Budgets keep their own counters: they belong to scopes wider than a session (key, team,
everyone) and are added atomically across replicas.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.exchange import Exchange
from proxy.store.base import StoreError
from proxy.store.state import StateStore

SPACE = "guards"
TTL_S = 86_400.0  # a session quiet for a day starts afresh


async def read(state: StateStore, ex: Exchange) -> dict[str, Any]:
    """The session's record, read from the state store at most once per request. Unreadable
    (store down, a value from another version) reads as empty: the session is as if new."""
    if ex.guard_record is None:
        try:
            data = await state.get(SPACE, ex.identity.session)
        except StoreError:
            data = None
        try:
            record = orjson.loads(data) if data else {}
        except orjson.JSONDecodeError:
            record = {}
        ex.guard_record = record if isinstance(record, dict) else {}
    return ex.guard_record


async def write(state: StateStore, ex: Exchange, part: str, value: Any) -> None:
    """Set one guard's part (None removes it); an unchanged record costs no write. Raises
    StoreError: each guard decides what a lost write means."""
    record = dict(await read(state, ex))
    if value is None:
        record.pop(part, None)
    else:
        record[part] = value
    if record == ex.guard_record:
        return
    ex.guard_record = record
    if record:
        await state.set(SPACE, ex.identity.session, orjson.dumps(record), TTL_S)
    else:
        await state.delete(SPACE, ex.identity.session)
