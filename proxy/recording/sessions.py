"""Recorded sessions in the store: each turn written after its answer, read back as trace lines.

Layout, in the session's own blobs (so they expire with it under store.session_ttl and count
toward its owner's store.max_owner_share):

    record_part   one message (or a body without its messages), content-addressed: a history
                  re-sent every turn is stored once, message by message
    record_turn   {"v", "wire", "route", "request": LIST, "sent": LIST, "answer", "status",
                   "events", "usage", "model", "at", "seq"}, LIST being {"body": part ref of
                   the body without its messages, "key": "messages" | "input" | None, "base":
                   the previous turn's ref, "keep": how many of its messages lead this one's,
                   "new": the part refs of the rest}: a turn costs its new messages only.

Nothing is written before it is redacted (proxy/recording/redact.py). The writer runs in one
task, off the requests' path, in the order turns finished; a store that fails or refuses is
counted and said (rate-limited), never the request's failure. A session whose recording would
pass record.max_mb_per_session stops being recorded (an event and a count say so).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash
from cachetools import LRUCache

from proxy.exchange import Exchange
from proxy.logs.limit import warn_limited
from proxy.metrics import Metrics
from proxy.policies.spec import Config
from proxy.recording.answers import answer_of
from proxy.recording.redact import matcher, scrub
from proxy.store.base import RECORD_PART, RECORD_TURN, BlobInfo, Store, content_ref

log = logging.getLogger("agentproxy.recording")

MB = 1024 * 1024
QUEUED_TURNS = 1000  # turns waiting for the writer, at most; past it a turn is dropped
MEMO_BYTES = 16 * MB  # what this process remembers of recorded sessions (known parts)
LISTS = ("request", "sent")


@dataclass(slots=True)
class Finished:
    """What a finished request leaves for its session's recording."""

    ex: Exchange
    raw: bytes | None  # the request as received
    status: int
    body: bytes | None  # a whole answer's bytes (a stream's are in ex.streamed)
    error: dict[str, Any] | None  # the proxy's own error, when it answered one
    secrets: tuple[str, ...]  # keys to redact besides the policy's patterns
    at: float = field(default_factory=time.time)


@dataclass(slots=True)
class _Known:
    """What this process knows of one session's recording."""

    bytes: int = 0  # stored so far
    seq: int = 0  # turns recorded
    stopped: bool = False
    parts: dict[int, str] = field(default_factory=dict)  # xxh3 of a part's raw JSON -> ref
    stored: set[str] = field(default_factory=set)  # refs known to be in the store already
    last_turn: str | None = None
    last_lists: dict[str, list[int]] = field(default_factory=dict)

    def size(self) -> int:
        return (
            200
            + 90 * (len(self.parts) + len(self.stored))
            + 8 * sum(len(hashes) for hashes in self.last_lists.values())
        )


class TurnWriter:
    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        on_stopped: Callable[[Exchange, dict[str, Any]], None],
        memo_bytes: int = MEMO_BYTES,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.on_stopped = on_stopped  # the recorder says it: headers, metrics, event log
        self._queue: asyncio.Queue[Finished] | None = None
        self._task: asyncio.Task[None] | None = None
        self._known: LRUCache[str, _Known] = LRUCache(memo_bytes, getsizeof=_Known.size)

    def submit(self, turn: Finished) -> None:
        """Queue a finished turn (never waits: the writer task takes it from there)."""
        if self._queue is None or self._task is None or self._task.done():
            self._queue = asyncio.Queue(QUEUED_TURNS)
            self._task = asyncio.get_running_loop().create_task(self._work(self._queue))
        try:
            self._queue.put_nowait(turn)
        except asyncio.QueueFull:
            self._count("dropped")
            warn_limited(log, "recording.dropped", "recording falls behind: a turn was dropped")

    async def flush(self) -> None:
        """Wait until every turn queued so far is written (tests, shutdown)."""
        if self._queue is not None and self._task is not None and not self._task.done():
            await self._queue.join()

    async def close(self, wait_s: float = 5.0) -> None:
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self.flush(), wait_s)
        except TimeoutError:
            warn_limited(log, "recording.close", "recording: turns still queued were lost")
        self._task.cancel()
        self._task = None

    def forget(self, sessions: set[str]) -> None:
        """Idle sessions: what the store may evict next is no longer taken as stored."""
        for session in sessions:
            self._known.pop(session, None)

    def memo(self) -> LRUCache[str, _Known]:
        return self._known

    async def _work(self, queue: asyncio.Queue[Finished]) -> None:
        while True:
            turn = await queue.get()
            try:
                await self._write(turn)
            except Exception as exc:
                self._count("failed")
                warn_limited(log, "recording.failed", "recording a turn failed: %s: %s",
                             type(exc).__name__, exc)  # fmt: skip
            finally:
                queue.task_done()

    async def _write(self, turn: Finished) -> None:
        ex = turn.ex
        session = ex.identity.session
        known = await self._session(session)
        if known.stopped:
            self._count("skipped")
            return
        spec = ex.policy.record
        redact = matcher(spec.redact_pattern, turn.secrets)
        writes: dict[str, bytes] = {}
        hashes: dict[str, list[int]] = {}
        parts: dict[int, str] = {}
        received = _parsed(turn.raw)
        request = self._split(known, session, received, "request", redact, writes, hashes, parts)
        sent = self._split(known, session, ex.sent, "sent", redact, writes, hashes, parts)
        events = [{"stage": n.stage, "action": n.action, **n.fields} for n in ex.notes]
        if turn.error is not None:
            events.append({"stage": "error", "action": "answered", **turn.error})
        usage = ex.accounting.usage
        record = {
            "v": 1,
            "seq": known.seq,
            "wire": ex.client.wire,
            "route": ex.client.route,
            "request": request,
            "sent": sent,
            "answer": scrub(answer_of(ex.client.wire, turn.body, ex.streamed), redact),
            "status": turn.status,
            "events": scrub(orjson.loads(orjson.dumps(events, default=str)), redact),
            "usage": None if usage is None else usage.described(),
            "cost_usd": ex.accounting.cost_usd,
            "model": ex.alias,
            "at": round(turn.at, 3),
        }
        data = orjson.dumps(record, default=str)
        adding = len(data) + sum(len(part) for part in writes.values())
        limit = int(spec.max_mb_per_session * MB)
        if known.bytes + adding > limit:
            known.stopped = True
            self._count("stopped")
            self.on_stopped(
                ex, {"bytes": known.bytes, "max_mb_per_session": spec.max_mb_per_session}
            )
            return
        owner = ex.identity.owner
        for ref, part in writes.items():
            await self.store.put(
                BlobInfo(ref, session, RECORD_PART, len(part), turn.at, owner), part
            )
            known.stored.add(ref)
        ref = content_ref(session, RECORD_TURN, data)
        meta = {"seq": known.seq}
        await self.store.put(
            BlobInfo(ref, session, RECORD_TURN, len(data), turn.at, owner, meta), data
        )
        known.bytes += adding
        known.seq += 1
        known.parts.update(parts)
        known.last_turn = ref
        known.last_lists = hashes
        self._known[session] = known  # its size changed: the memo weighs it again
        self._count("recorded")

    def _split(
        self,
        known: _Known,
        session: str,
        body: Any,
        which: str,
        redact: Any,
        writes: dict[str, bytes],
        hashes: dict[str, list[int]],
        parts: dict[int, str],
    ) -> dict[str, Any] | None:
        """A body as parts: its messages each once, the rest once; what is new goes to
        `writes`. Relative to the previous turn's list of the same kind: a kept prefix."""
        if not isinstance(body, dict):
            return None
        key = next((k for k in ("messages", "input") if isinstance(body.get(k), list)), None)
        items: list[Any] = body[key] if key is not None else []
        rest = {k: v for k, v in body.items() if k != key} if key is not None else body
        rest_ref = self._part(known, session, rest, redact, writes, parts)[1]
        mine: list[int] = []
        refs: list[str] = []
        for item in items:
            digest, ref = self._part(known, session, item, redact, writes, parts)
            mine.append(digest)
            refs.append(ref)
        hashes[which] = mine
        before = known.last_lists.get(which) or []
        keep = 0
        for old, new in zip(before, mine, strict=False):
            if old != new:
                break
            keep += 1
        base = known.last_turn if keep else None
        return {"body": rest_ref, "key": key, "base": base, "keep": keep, "new": refs[keep:]}

    def _part(
        self,
        known: _Known,
        session: str,
        value: Any,
        redact: Any,
        writes: dict[str, bytes],
        parts: dict[int, str],
    ) -> tuple[int, str]:
        raw = orjson.dumps(value)
        digest = xxhash.xxh3_64_intdigest(raw)
        ref = known.parts.get(digest) or parts.get(digest)
        if ref is None:
            clean = scrub(value, redact)
            data = raw if clean is value else orjson.dumps(clean)
            ref = content_ref(session, RECORD_PART, data)
            parts[digest] = ref
            if ref not in known.stored:
                writes[ref] = data
        return digest, ref

    async def _session(self, session: str) -> _Known:
        known = self._known.get(session)
        if known is not None:
            return known
        known = _Known()  # new to this process: what the store already holds of it
        for info in await self.store.blobs(session):
            if info.kind in (RECORD_PART, RECORD_TURN):
                known.bytes += info.size
                known.stored.add(info.ref)
                known.seq += info.kind == RECORD_TURN
        self._known[session] = known
        return known

    def _count(self, outcome: str) -> None:
        self.metrics.child(self.metrics.recorded_turns, outcome).inc()


_secrets: LRUCache[str, tuple[str, ...]] = LRUCache(8)


def secrets_of(config: Config, presented: str | None) -> tuple[str, ...]:
    """What a recording never keeps besides the policy's patterns: the key the client
    presented, and every deployment's api_key (one tuple per configuration version)."""
    keys = _secrets.get(config.version)
    if keys is None:
        found = {d.api_key for group in config.deployments.values() for d in group if d.api_key}
        keys = _secrets[config.version] = tuple(sorted(found))
    return keys if presented is None else (*keys, presented)


def _parsed(raw: bytes | None) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


async def recorded_turns(store: Store, session_key: str) -> list[dict[str, Any]]:
    """The session's recorded turns, oldest first, as trace lines (/tmp/trace-format.md):
    `session_key` is the scoped session (ex.identity.session), so only its owner's."""
    infos = [
        info
        for info in await store.blobs(session_key)
        if info.kind == RECORD_TURN and info.session == session_key
    ]
    infos.sort(key=lambda info: (info.created_at, info.meta.get("seq", 0)))
    parts: dict[str, Any] = {}
    lists: dict[str, dict[str, list[str]]] = {}
    turns: list[dict[str, Any]] = []
    for info in infos:
        found = await store.get(info.ref)
        if found is None:  # expired meanwhile
            continue
        record = orjson.loads(found[1])
        resolved: dict[str, list[str]] = {}
        bodies: dict[str, Any] = {}
        for which in LISTS:
            shape = record.get(which)
            if not isinstance(shape, dict):
                continue
            base = lists.get(shape.get("base") or "", {}).get(which, [])
            refs = [*base[: shape.get("keep", 0)], *shape.get("new", [])]
            resolved[which] = refs
            bodies[which] = await _body(store, session_key, shape, refs, parts)
        lists[info.ref] = resolved
        line: dict[str, Any] = {"wire": record["wire"], "route": record.get("route")}
        line["request"] = bodies.get("request") or {}
        for name in ("answer", "status"):
            if record.get(name) is not None:
                line[name] = record[name]
        if "sent" in bodies:
            line["sent"] = bodies["sent"]
        line["events"] = record.get("events") or []
        for name in ("usage", "model", "at"):
            if record.get(name) is not None:
                line[name] = record[name]
        turns.append(line)
    return turns


async def _body(
    store: Store, session: str, shape: dict[str, Any], refs: list[str], parts: dict[str, Any]
) -> dict[str, Any]:
    body = await _part(store, session, shape["body"], parts)
    body = dict(body) if isinstance(body, dict) else {}
    if shape.get("key"):
        body[shape["key"]] = [await _part(store, session, ref, parts) for ref in refs]
    return body


async def _part(store: Store, session: str, ref: str, parts: dict[str, Any]) -> Any:
    if ref not in parts:
        found = await store.get(ref)
        ok = found is not None and found[0].session == session
        parts[ref] = orjson.loads(found[1]) if ok and found is not None else {"missing": ref}
    return parts[ref]
