"""Recorded sessions in the store: each turn written after its answer (read back: reader.py).

Layout, in the session's own blobs (so they expire with it under store.session_ttl and count
toward its owner's store.max_owner_share):

    record_part   one message (or a body without its messages), content-addressed: a history
                  re-sent every turn is stored once, message by message
    record_turn   {"v", "wire", "route", "request": LIST, "sent": LIST, "answer", "status",
                   "headers" (the client's protocol headers), "events", "usage", "model",
                   "at", "seq"}, LIST being {"body": part ref of the body without its
                   messages, "key": "messages" | "input" | None, "base": the previous turn's
                   ref, "keep": how many of its messages lead this one's, "new": the part
                   refs of the rest}: a turn costs its new messages only.

Nothing is written before it is redacted (proxy/recording/redact.py). The writer runs in one
task, off the requests' path, in the order turns finished; a store that fails or refuses is
counted and said (rate-limited), never the request's failure. A session whose recording would
pass record.max_mb_per_session stops being recorded (an event and a count say so).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash
from cachetools import LRUCache

from proxy.exchange import Exchange
from proxy.logs.limit import warn_limited
from proxy.metrics import Metrics
from proxy.policies.spec import Config
from proxy.recording.answers import Assemble, answer_in_slices, answer_of, assembled_size
from proxy.recording.reader import recorded_turns as recorded_turns  # read back: reader.py
from proxy.recording.redact import Redaction, matcher
from proxy.store.base import RECORD_PART, RECORD_TURN, BlobInfo, Store, content_ref

log = logging.getLogger("agentproxy.recording")

MB = 1024 * 1024
QUEUED_TURNS = 1000  # turns waiting for the writer, at most; past it a turn is dropped
QUEUED_BYTES = 64 * MB  # and the request bytes they hold, at most
BATCH_TURNS = 256  # turns written together when they queued up meanwhile
RECENT_TURNS = 16  # turns a session remembers the hashes of (requests in flight at once)
LINGER_S = 0.1  # how long the writer waits for more turns before it writes
MEMO_BYTES = 16 * MB  # what this process remembers of recorded sessions (known parts)
# A streamed answer up to this is assembled at once (about a ms); a longer one by the writer,
# in slices that let the event loop run between them.
INLINE_ANSWER_BYTES = 64 * 1024
_UNREAD: Any = object()  # the answer is not assembled yet


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
class _Prepared:
    """A turn split into the blobs to write (the request's objects already let go)."""

    session: str
    owner: str
    blobs: list[tuple[BlobInfo, bytes]]
    size: int


Queued = Finished | _Prepared


@dataclass(slots=True)
class _Known:
    """What this process knows of one session's recording."""

    bytes: int = 0  # stored so far
    seq: int = 0  # turns recorded
    stopped: bool = False
    parts: dict[int, str] = field(default_factory=dict)  # xxh3 of a part's raw JSON -> ref
    stored: set[str] = field(default_factory=set)  # refs known to be in the store already
    last_turn: str | None = None
    # The last turns recorded, by their token (ex.rewrite.turn; a native view's): (their ref,
    # their request's hashes), for the turn the chain or the view compares the next one with
    # (not always the last recorded).
    recent: dict[object, tuple[str, list[int]]] = field(default_factory=dict)
    last_lists: dict[str, list[int]] = field(default_factory=dict)

    def size(self) -> int:
        lists = [*self.last_lists.values(), *(hashes for _, hashes in self.recent.values())]
        return 200 + 90 * (len(self.parts) + len(self.stored)) + 8 * sum(map(len, lists))


class TurnWriter:
    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        on_stopped: Callable[[Exchange, dict[str, Any]], None],
        memo_bytes: int = MEMO_BYTES,
        on_unrecorded: Callable[[str, str, int], None] | None = None,
        *,
        assemblies: Mapping[str, Assemble],
    ) -> None:
        self.store = store
        self.assemblies = assemblies  # by wire name: how its streamed answers are put together
        self.metrics = metrics
        self.on_stopped = on_stopped  # the recorder says it: headers, metrics, event log
        # (session, outcome, turns): turns of a session not recorded, and why (the board
        # shows them: a turn is never left out silently).
        self.on_unrecorded = on_unrecorded
        self._queue: asyncio.Queue[Queued] | None = None
        self._waiting: dict[str, int] = {}  # sessions with whole turns queued: how many
        self._task: asyncio.Task[None] | None = None
        self._queued_bytes = 0  # what the queued turns hold (their requests' bytes)
        self.hashed = 0  # messages serialized and hashed so far (per-turn work: the new ones)
        self._known: LRUCache[str, _Known] = LRUCache(memo_bytes, getsizeof=_Known.size)

    def submit(self, turn: Finished) -> None:
        """Take a finished turn (never waits). A session this process knows is split into
        its blobs at once after the answer (call_soon: the request's objects are let go
        then), the blobs queued for the writer; a new one is queued whole (its state is read
        from the store first)."""
        if self._queue is None or self._task is None or self._task.done():
            self._queue = asyncio.Queue(QUEUED_TURNS)
            self._queued_bytes = 0
            self._waiting.clear()
            self._task = asyncio.get_running_loop().create_task(self._work(self._queue))
        session = turn.ex.identity.session
        if session in self._known and not self._waiting.get(session) and not _long_answer(turn):
            asyncio.get_running_loop().call_soon(self._prepare_soon, turn)
        else:
            self._enqueue(turn)

    def _prepare_soon(self, turn: Finished) -> None:
        session = turn.ex.identity.session
        known = self._known.get(session)
        if known is None or self._waiting.get(session):  # forgotten meanwhile: read it again
            self._enqueue(turn)
            return
        try:
            blobs = self._prepare(turn, known)
        except Exception as exc:
            self._failed(exc, {session: 1})
            self._known.pop(session, None)
            return
        if blobs:
            size = sum(len(data) for _, data in blobs)
            self._enqueue(_Prepared(session, turn.ex.identity.owner, blobs, size))

    def _enqueue(self, item: Queued) -> None:
        assert self._queue is not None
        size = _held(item)
        try:
            if self._queued_bytes + size > QUEUED_BYTES:
                raise asyncio.QueueFull
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            session = item.session if isinstance(item, _Prepared) else item.ex.identity.session
            if isinstance(item, _Prepared):  # its state had moved past blobs never written
                self._known.pop(session, None)
            self._count("dropped", session)
            warn_limited(log, "recording.dropped", "recording falls behind: a turn was dropped")
            return
        self._queued_bytes += size
        if isinstance(item, Finished):
            session = item.ex.identity.session
            self._waiting[session] = self._waiting.get(session, 0) + 1

    async def flush(self) -> None:
        """Wait until every turn queued so far is written (tests, shutdown)."""
        await asyncio.sleep(0)  # the turns split at once: queued first
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

    async def _work(self, queue: asyncio.Queue[Queued]) -> None:
        while True:
            batch = [await queue.get()]
            if queue.qsize() < BATCH_TURNS:  # a moment for more to come: one write for all
                await asyncio.sleep(LINGER_S)
            while len(batch) < BATCH_TURNS and not queue.empty():
                batch.append(queue.get_nowait())
            try:
                await self._write(batch)
            finally:
                for item in batch:
                    self._queued_bytes -= _held(item)
                    queue.task_done()

    async def _write(self, batch: list[Queued]) -> None:
        """The turns' new blobs, each owner's in one store call (one transaction in SQLite,
        one round trip to Redis); a failure loses those turns only, counted and said."""
        by_owner: dict[str, list[tuple[BlobInfo, bytes]]] = {}
        sessions: dict[str, dict[str, int]] = {}  # each owner's: turns by session
        await self._read_new(batch)
        for item in batch:
            if isinstance(item, Finished):
                prepared = await self._prepare_queued(item)
                if prepared is None:
                    continue
                item_session, owner, blobs = prepared
            else:
                item_session, owner, blobs = item.session, item.owner, item.blobs
            by_owner.setdefault(owner, []).extend(blobs)
            turns = sessions.setdefault(owner, {})
            turns[item_session] = turns.get(item_session, 0) + 1
        for owner, blobs in by_owner.items():
            try:
                await _put_many(self.store, blobs)
            except Exception as exc:
                self._failed(exc, sessions[owner])
                self.forget(set(sessions[owner]))  # what they hold is read again from the store
                continue
            recorded = sum(sessions[owner].values())
            self.metrics.child(self.metrics.recorded_turns, "recorded").inc(recorded)

    async def _read_new(self, batch: list[Queued]) -> None:
        """The state of the batch's sessions new to this process, read from the store all at
        once: one round trip each, one after the other, fell behind many new sessions."""
        new = {
            item.ex.identity.session
            for item in batch
            if isinstance(item, Finished) and item.ex.identity.session not in self._known
        }
        if new:  # a failure is met again, and counted, by the turn itself
            await asyncio.gather(*map(self._session, new), return_exceptions=True)

    async def _prepare_queued(
        self, turn: Finished
    ) -> tuple[str, str, list[tuple[BlobInfo, bytes]]] | None:
        """A turn queued whole: a long answer assembled (in slices), its session's state read
        (from the store, if new), then split."""
        session = turn.ex.identity.session
        try:
            answer = _UNREAD
            known = self._known.get(session)
            if _long_answer(turn) and not (known is not None and known.stopped):
                assemble = self.assemblies[turn.ex.client.wire]
                answer = await answer_in_slices(assemble, turn.body, turn.ex.streamed)
            blobs = self._prepare(turn, await self._session(session), answer)
        except Exception as exc:
            self._failed(exc, {session: 1})
            self._known.pop(session, None)
            return None
        finally:
            left = self._waiting.get(session, 1) - 1
            if left > 0:
                self._waiting[session] = left
            else:
                self._waiting.pop(session, None)
        return (session, turn.ex.identity.owner, blobs) if blobs else None

    def _prepare(
        self, turn: Finished, known: _Known, answer: Any = _UNREAD
    ) -> list[tuple[BlobInfo, bytes]]:
        """The turn's blobs not yet stored, its session's state moved past it (undone by
        forgetting the session should the write fail). `answer`: the answer, if assembled."""
        ex = turn.ex
        session = ex.identity.session
        if known.stopped:
            self._count("skipped", session)
            return []
        spec = ex.policy.record
        split = _Split(known, session, matcher(spec.redact_pattern, turn.secrets))
        this, base, shared, key = _lineage(ex)
        if ex.received is not None:  # the body as parsed, never mutated
            # As far as its list agrees with the turn it was compared with, that turn's
            # hashes are its entries' (not hashed again), if this recording holds that turn.
            prior = known.recent.get(base) if base is not None else None
            keep = shared if prior is not None and _list_key(ex.received) == key else 0
            request = split.body(ex.received, "request", keep, prior)
        else:
            request = split.body(_parsed(turn.raw), "request", 0)
        sent = split.body(ex.sent, "sent", 0)
        events: Any = []
        if ex.notes or turn.error is not None:
            events = [{"stage": n.stage, "action": n.action, **n.fields} for n in ex.notes]
            if turn.error is not None:
                events.append({"stage": "error", "action": "answered", **turn.error})
            events = split.redaction.value(orjson.loads(orjson.dumps(events, default=str)))
        usage = ex.accounting.usage
        record = {
            "v": 1,
            "seq": known.seq,
            "wire": ex.client.wire,
            "route": ex.client.route,
            "request": request,
            "sent": sent,
            "answer": _answer(
                self.assemblies[ex.client.wire], turn.body, ex.streamed, split.redaction, answer
            ),
            "status": turn.status,
            # The client's protocol headers (Anthropic's version and betas: the request's
            # meaning depends on them); never its credentials.
            "headers": split.redaction.value(dict(ex.client.forward_headers)) or None,
            "events": events,
            "usage": None if usage is None else usage.described(),
            "cost_usd": ex.accounting.cost_usd,
            "model": ex.alias,
            "at": round(turn.at, 3),
        }
        data = orjson.dumps(record, default=str)
        self.hashed += split.hashed
        writes = split.writes
        adding = len(data) + sum(len(part) for part in writes.values())
        limit = int(spec.max_mb_per_session * MB)
        if known.bytes + adding > limit:
            known.stopped = True
            self._count("stopped", session)
            fields = {"bytes": known.bytes, "max_mb_per_session": spec.max_mb_per_session}
            self.on_stopped(ex, fields)
            return []
        owner = ex.identity.owner
        blobs = [
            (BlobInfo(ref, session, RECORD_PART, len(part), turn.at, owner), part)
            for ref, part in writes.items()
        ]
        ref = content_ref(session, RECORD_TURN, data)
        meta = {"seq": known.seq}
        blobs.append((BlobInfo(ref, session, RECORD_TURN, len(data), turn.at, owner, meta), data))
        known.stored.update(writes)
        known.bytes += adding
        known.seq += 1
        known.last_turn = ref
        if this is not None:
            known.recent[this] = (ref, split.hashes.get("request", []))
            if len(known.recent) > RECENT_TURNS:
                del known.recent[next(iter(known.recent))]
        known.last_lists = split.hashes
        if split.parts:
            known.parts.update(split.parts)
            self._known[session] = known  # it grew: the memo weighs it again
        return blobs

    def _failed(self, exc: Exception, turns: dict[str, int]) -> None:
        """`turns`: how many of each session's were lost."""
        for session, count in turns.items():
            self._count("failed", session, count)
        warn_limited(log, "recording.failed", "recording a turn failed: %s: %s",
                     type(exc).__name__, exc)  # fmt: skip

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

    def _count(self, outcome: str, session: str, turns: int = 1) -> None:
        """Turns of `session` not recorded, and why: the metric and the session's own count."""
        self.metrics.child(self.metrics.recorded_turns, outcome).inc(turns)
        if self.on_unrecorded is not None:
            self.on_unrecorded(session, outcome, turns)


_secrets: LRUCache[str, tuple[str, ...]] = LRUCache(8)


def secrets_of(config: Config, presented: str | None) -> tuple[str, ...]:
    """What a recording never keeps besides the policy's patterns: the key the client
    presented, and every deployment's api_key and extra_headers values (one tuple per
    configuration version)."""
    keys = _secrets.get(config.version)
    if keys is None:
        found = {s for group in config.deployments.values() for d in group for s in d.secrets()}
        keys = _secrets[config.version] = tuple(sorted(found))
    return keys if presented is None else (*keys, presented)


class _Split:
    """One turn's bodies as parts: each message once, each body without its messages once;
    what the session has not stored yet goes to `writes`, redacted."""

    def __init__(self, known: _Known, session: str, redaction: Redaction) -> None:
        self.known = known
        self.session = session
        self.redaction = redaction
        self.writes: dict[str, bytes] = {}
        self.hashes: dict[str, list[int]] = {}
        self.parts: dict[int, str] = {}  # new this turn: xxh3 of the raw JSON -> ref
        self._by_id: dict[int, int] = {}  # id of a message hashed this turn -> its hash
        self._lists: dict[int, list[int]] = {}  # id of a list hashed this turn -> hashes
        self._seen: list[tuple[list[Any], list[int]]] = []  # (the lists hashed, their hashes)
        self._rests: list[tuple[dict[str, Any], str]] = []  # bodies' rests split this turn
        # Bodies split this turn, by id (held, so the id stays theirs): a request sent as
        # received (a native view's untouched body) is the same object, split once.
        self._bodies: dict[int, tuple[Any, str | None, list[Any], str, int | None]] = {}
        self.hashed = 0  # messages serialized and hashed

    def body(
        self,
        body: Any,
        which: str,
        keep: int,
        prior: tuple[str, list[int]] | None = None,
    ) -> dict[str, Any] | None:
        """`body` as parts, its list relative to an earlier turn's (a kept prefix): `prior`
        (its ref and hashes), else the last recorded. The first `keep` messages are known
        equal to that turn's: taken, not hashed."""
        if not isinstance(body, dict):
            return None
        split = self._bodies.get(id(body))
        if split is None:
            key = _list_key(body)
            items: list[Any] = body[key] if key is not None else []
            rest = {k: v for k, v in body.items() if k != key} if key is not None else body
            at = list(body).index(key) if key is not None else None  # where it goes back
            split = self._bodies[id(body)] = (body, key, items, self._rest(rest), at)
        _, key, items, rest_ref, at = split
        base_ref: str | None
        if prior is not None:
            base_ref, before = prior
        else:
            base_ref, before = self.known.last_turn, self.known.last_lists.get(which) or []
        mine = self._lists.get(id(items))
        if mine is None:  # not the very list another body of this turn had
            mine = self._hashed(items, before, keep)
            self._lists[id(items)] = mine
        self.hashes[which] = mine
        keep = min(len(before), len(mine))
        if mine[:keep] != before[:keep]:  # the common turn compares equal, in C
            keep = next(i for i, (a, b) in enumerate(zip(before, mine, strict=False)) if a != b)
        refs = [self._ref(digest) for digest in mine[keep:]]
        base = base_ref if keep else None
        shape = {"body": rest_ref, "key": key, "at": at, "base": base, "keep": keep}
        return {**shape, "new": refs}

    def _rest(self, rest: dict[str, Any]) -> str:
        """A body's part without its messages: another body's of this turn when it holds the
        very same values (a request sent as received), else stored like a message."""
        for seen, ref in self._rests:
            if len(seen) == len(rest) and all(seen.get(k) is v for k, v in rest.items()):
                return ref
        ref = self._part(rest, xxhash.xxh3_64_intdigest(orjson.dumps(rest)))
        self._rests.append((rest, ref))
        return ref

    def _hashed(self, items: list[Any], before: list[int], keep: int) -> list[int]:
        keep = min(keep, len(before), len(items))
        mine = before[:keep]
        by_id = self._by_id
        if self._seen and not by_id:  # a second list: messages of the first, unchanged?
            for seen, hashes in self._seen:
                by_id.update(zip(map(id, seen), hashes, strict=True))
        for item in items[keep:]:
            digest = by_id.get(id(item))
            if digest is None:
                raw = orjson.dumps(item)
                digest = xxhash.xxh3_64_intdigest(raw)
                self._part(item, digest, raw)
                self.hashed += 1
            mine.append(digest)
        self._seen.append((items, mine))
        return mine

    def _ref(self, digest: int) -> str:
        return self.known.parts.get(digest) or self.parts[digest]

    def _part(self, value: Any, digest: int, raw: bytes | None = None) -> str:
        ref = self.known.parts.get(digest) or self.parts.get(digest)
        if ref is None:
            data = self.redaction.json(value, raw if raw is not None else orjson.dumps(value))
            ref = content_ref(self.session, RECORD_PART, data)
            self.parts[digest] = ref
            if ref not in self.known.stored:
                self.writes[ref] = data
        return ref


def _long_answer(turn: Finished) -> bool:
    return assembled_size(turn.body, turn.ex.streamed) > INLINE_ANSWER_BYTES


def _answer(
    assemble: Assemble,
    body: bytes | None,
    streamed: list[bytes] | None,
    redaction: Redaction,
    assembled: Any = _UNREAD,
) -> Any:
    """The answer for the turn record: a JSON body kept as its bytes when nothing in it is
    to be redacted (no parse), else parsed (a stream assembled, unless it was) and redacted."""
    if assembled is not _UNREAD:
        return redaction.value(assembled)
    whole = not streamed and body is not None and body[:1] == b"{" and body.rstrip()[-1:] == b"}"
    if (
        whole
        and body is not None
        and (redaction.pattern is None or not (redaction.always or _holds(body, redaction)))
    ):
        return orjson.Fragment(body)
    return redaction.value(answer_of(assemble, body, streamed))


def _holds(raw: bytes, redaction: Redaction) -> bool:
    return any(literal in raw for literal in redaction.literals)


def _lineage(ex: Exchange) -> tuple[object | None, object | None, int, str]:
    """This turn (a token), the turn its history was compared with, how many leading entries
    of its list are equal to that one's, and which list: the chain's comparison for a chat
    body; the view's of the native entries for another wire's (equal chat views do not prove
    equal items: encrypted reasoning, signatures)."""
    native = ex.client.native
    if native is None:
        rewrite = ex.rewrite
        return rewrite.turn, rewrite.stable_base, rewrite.stable_prefix, "messages"
    prefix = native.native_prefix()
    return prefix.turn, prefix.base, prefix.shared, prefix.key


def _list_key(body: dict[str, Any]) -> str | None:
    """Where a body keeps the list the recording stores entry by entry."""
    for key in ("messages", "input", "contents"):
        if isinstance(body.get(key), list):
            return key
    return None


def _held(item: Queued) -> int:
    """What a queued item keeps alive, roughly: a whole turn its request's bytes (and their
    parse), a split one its blobs."""
    if isinstance(item, _Prepared):
        return item.size
    request = 2 * (len(item.raw) if item.raw else item.ex.client.body_bytes)
    return request + sum(map(len, item.ex.streamed or ()))


async def _put_many(store: Store, blobs: list[tuple[BlobInfo, bytes]]) -> None:
    many = getattr(store, "put_many", None)
    if many is not None:
        await many(blobs)
        return
    for info, data in blobs:
        await store.put(info, data)


def _parsed(raw: bytes | None) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
