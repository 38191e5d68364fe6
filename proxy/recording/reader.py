"""Reading a recorded session back (the layout: proxy/recording/sessions.py).

A turn record names its bodies' parts relative to an earlier turn's ({"base", "keep", "new"}),
so a turn's message list is known only by walking the records from the first. The walk holds
the part refs of the last WINDOW turns, never a body: `Recording.turns()` yields each turn with
its lists resolved, and a caller expands only the turns it shows (`body`), measures the others
from the parts' stored sizes (`size`, no part read) and looks for a ref's pointer text part by
part (`naming`). The parts read are kept in a cache bounded by bytes, as their stored JSON.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import LRUCache

from proxy.store.base import RECORD_PART, RECORD_TURN, BlobInfo, Store

LISTS = ("request", "sent")
# Resolved lists kept while walking: a turn's base is one of the last 16 recorded
# (sessions.RECENT_TURNS) or the one before it; the margin covers turns finishing out of order.
WINDOW = 64
CACHE_BYTES = 16 * 1024 * 1024  # parts' JSON kept by one reader


@dataclass(slots=True)
class RecordedTurn:
    number: int  # 1 for the first recorded, as the session counts them
    record: dict[str, Any]  # the turn record as stored: bodies as part lists
    refs: dict[str, list[str]]  # each body's list ("request", "sent"): its part refs, in order


class Recording:
    """One session's recording, opened: its turns in order, read a turn at a time."""

    def __init__(
        self, store: Store, session: str, infos: list[BlobInfo], shared: bool = False
    ) -> None:
        self.store = store
        self.session = session
        turns = [i for i in infos if i.kind == RECORD_TURN and i.session == session]
        turns.sort(key=lambda info: (info.created_at, info.meta.get("seq", 0)))
        self._turns = turns
        self._sizes = {i.ref: i.size for i in infos if i.kind == RECORD_PART}
        self._raw: LRUCache[str, bytes] = LRUCache(CACHE_BYTES, getsizeof=len)
        # `shared`: every part parsed once and the same object in every body (a whole
        # session held at once, as replay does: memory as the store's, not turns x history).
        self._parsed: dict[str, Any] | None = {} if shared else None

    @classmethod
    async def open(cls, store: Store, session: str, shared: bool = False) -> Recording:
        """`session` is the scoped session (ex.identity.session): only its owner's blobs."""
        return cls(store, session, await store.blobs(session), shared)

    def __len__(self) -> int:
        return len(self._turns)

    def client_turns(self) -> int | None:
        """How many client turns the recorded calls make (a person's prompts: each turn
        record's meta says which one it belongs to); None for a recording written before
        turns were counted."""
        counted = [info.meta["turn"] for info in self._turns if "turn" in info.meta]
        return max(counted) if counted else None

    async def last(self) -> dict[str, Any] | None:
        """The last turn's record (its model, when), without walking the others."""
        for info in reversed(self._turns):
            found = await self.store.get(info.ref)
            if found is not None:
                return dict(orjson.loads(found[1]))
        return None

    async def turns(self, after: int = 0) -> AsyncGenerator[RecordedTurn]:
        """The turns numbered past `after`, oldest first (one expired meanwhile is skipped)."""
        window: OrderedDict[str, dict[str, list[str]]] = OrderedDict()
        for number, info in enumerate(self._turns, 1):
            found = await self.store.get(info.ref)
            if found is None:
                continue
            record = orjson.loads(found[1])
            refs: dict[str, list[str]] = {}
            for which in LISTS:
                shape = record.get(which)
                if isinstance(shape, dict):
                    base = window.get(shape.get("base") or "", {}).get(which, [])
                    refs[which] = [*base[: shape.get("keep", 0)], *shape.get("new", [])]
            window[info.ref] = refs
            if len(window) > WINDOW:
                window.popitem(last=False)
            if number > after:
                yield RecordedTurn(number, record, refs)

    def size(self, turn: RecordedTurn, which: str) -> int | None:
        """The body's JSON length as `body` builds it, from the parts' stored sizes."""
        shape = turn.record.get(which)
        if not isinstance(shape, dict):
            return None
        rest = self._size(shape["body"])
        key = shape.get("key")
        if not key:
            return rest
        refs = turn.refs.get(which, [])
        items = sum(map(self._size, refs)) + max(0, len(refs) - 1)  # and the commas
        # `"key":[...]`, and a comma when the rest has entries (more than "{}")
        return rest + len(key) + 5 + items + (rest > 2)

    def _size(self, ref: str) -> int:
        size = self._sizes.get(ref)
        return size if size is not None else len(orjson.dumps({"missing": ref}))

    async def body(self, turn: RecordedTurn, which: str) -> dict[str, Any] | None:
        """The body as the client sent it (request) or the proxy sent it upstream (sent)."""
        shape = turn.record.get(which)
        if not isinstance(shape, dict):
            return None
        rest = await self._value(shape["body"])
        body = dict(rest) if isinstance(rest, dict) else {}
        key = shape.get("key")
        if key:
            items = [await self._value(ref) for ref in turn.refs.get(which, [])]
            pairs = list(body.items())
            pairs.insert(shape.get("at") or len(pairs), (key, items))  # the client's key order
            body = dict(pairs)
        return body

    async def naming(self, turn: RecordedTurn, which: str, refs: Iterable[str]) -> dict[str, str]:
        """For each of `refs`, the first string of the body (in its order) that contains it:
        part by part, a part parsed only when its JSON holds one of them."""
        shape = turn.record.get(which)
        wanted = set(refs)
        found: dict[str, str] = {}
        if not isinstance(shape, dict) or not wanted:
            return found

        def look(value: Any) -> None:
            for text in _strings(value):
                for ref in [r for r in wanted if r in text]:
                    found[ref] = text
                    wanted.discard(ref)

        rest = await self._value(shape["body"])
        values = list(rest.values()) if isinstance(rest, dict) else []
        at = (shape.get("at") or len(values)) if shape.get("key") else len(values)
        look(values[:at])
        for ref in turn.refs.get(which, []) if shape.get("key") else ():
            if not wanted:
                break
            raw = await self._read(ref)
            if raw is not None and any(r.encode() in raw for r in wanted):
                look(orjson.loads(raw))
        look(values[at:])
        return found

    async def part(self, ref: str) -> Any:
        """One stored part, parsed (a message, or a body without its messages)."""
        return await self._value(ref)

    async def _value(self, ref: str) -> Any:
        if self._parsed is not None and ref in self._parsed:
            return self._parsed[ref]
        raw = await self._read(ref)
        value = orjson.loads(raw) if raw is not None else {"missing": ref}
        if self._parsed is not None:
            self._parsed[ref] = value
        return value

    async def _read(self, ref: str) -> bytes | None:
        raw = self._raw.get(ref)
        if raw is not None:
            return raw
        found = await self.store.get(ref)
        if found is None or found[0].session != self.session:
            return None
        if len(found[1]) <= CACHE_BYTES // 4:
            self._raw[ref] = found[1]
        return found[1]


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


async def recorded_turns(store: Store, session_key: str) -> list[dict[str, Any]]:
    """The session's recorded calls, oldest first, as trace lines (docs/cli.md), each with its
    client turn (`turn`, `opens`, `side`) when the recording counted them:
    `session_key` is the scoped session (ex.identity.session), so only its owner's. Every
    part is parsed once and shared between the turns that hold it."""
    recording = await Recording.open(store, session_key, shared=True)
    lines: list[dict[str, Any]] = []
    async for turn in recording.turns():
        record = turn.record
        line: dict[str, Any] = {"wire": record["wire"], "route": record.get("route")}
        line["request"] = await recording.body(turn, "request") or {}
        for name in ("answer", "status", "headers"):
            if record.get(name) is not None:
                line[name] = record[name]
        sent = await recording.body(turn, "sent")
        if sent is not None:
            line["sent"] = sent
        line["events"] = record.get("events") or []
        for name in ("usage", "model", "at", "turn", "opens", "side"):
            if record.get(name) is not None:
                line[name] = record[name]
        lines.append(line)
    return lines
