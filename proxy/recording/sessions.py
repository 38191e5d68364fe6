"""Recorded sessions in the store: each turn written after its answer (read back: reader.py).

Layout, in the session's own blobs (so they expire with it under store.session_ttl and count
toward its owner's store.max_owner_share):

    record_part   one message (or a body without its messages), content-addressed: a history
                  re-sent every turn is stored once, message by message
    record_turn   {"v", "wire", "route", "request": LIST, "sent": LIST, "answer", "status",
                   "error", "headers" (the client's protocol headers), "events", "usage",
                   "model", "at", "seq", "turn", "opens"}, LIST
                   being {"body": part ref of the body without its messages, "key":
                   "messages" | "input" | None, "base": the previous turn's ref, "keep": how
                   many of its messages lead this one's, "new": the part refs of the rest}: a
                   turn costs its new messages only.
                  "turn" is the client turn it belongs to (a person's prompt opens one,
                  "opens"; the agent's calls that only carry tool results continue it), also
                  in the blob's meta with "seq"; "error", for a failed turn, its status, who
                  said it and the message (redacted, at most ERROR_CHARS).

Each turn's figures (name, owner, model, status, usage, cost, context tokens received and sent
upstream) go with its record blob to its session's entry in the store's index of recorded
sessions (proxy/store/listing.py: what GET /admin/sessions lists, after a restart and on every
replica), in the same store call; the turns it does not record, by why, in one call a moment
later. Context tokens are the one measure replay reports (proxy/sim/measure.py), kept per
part: a turn measures its new messages only.

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
from typing import Any, Protocol

import orjson
import xxhash
from cachetools import LRUCache

from proxy.exchange import Exchange
from proxy.guards.secrets.recorded import with_placeholders
from proxy.logs.limit import warn_limited
from proxy.messages import CHAT
from proxy.metrics import Metrics
from proxy.policies.spec import Config
from proxy.recording.answers import Assemble, answer_in_slices, answer_of, assembled_size
from proxy.recording.conversation import (
    ERROR_CHARS,
    Conversation,
    cut,
    opening,
    opens_in,
)
from proxy.recording.reader import recorded_turns as recorded_turns  # read back: reader.py
from proxy.recording.redact import Redaction, matcher
from proxy.sessions.main_line import CallReading, MainLine, Opening
from proxy.store.base import RECORD_PART, RECORD_TURN, BlobInfo, Store, content_ref
from proxy.store.listing import Listed
from proxy.store.listing_batch import ListingBatch
from proxy.store.shares import session_owner

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
CLIENT_GONE = 499  # the status a turn whose client left is counted with (http/keys.py)
_UNREAD: Any = object()  # the answer is not assembled yet
UNLISTED_SESSIONS = 10_000  # sessions whose unrecorded turns wait to reach the index, at most


class ContextMeasure(Protocol):
    """How many context tokens a body's parts weigh, by wire (proxy/sim/measure.py)."""

    def entry_tokens(self, wire: str, entry: Any) -> int: ...

    def rest_tokens(self, wire: str, rest: dict[str, Any]) -> int: ...


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


Blobs = list[tuple[BlobInfo, bytes]]


@dataclass(slots=True)
class _Prepared:
    """A turn split into the blobs to write (the request's objects already let go)."""

    session: str
    owner: str
    blobs: Blobs
    size: int
    listed: dict[str, Listed]  # by its record's ref: the turn's figures for the index


Queued = Finished | _Prepared


@dataclass(slots=True)
class _Known:
    """What this process knows of one session's recording."""

    bytes: int = 0  # stored so far
    seq: int = 0  # turns recorded
    turns: int = 0  # client turns recorded (a person's prompts)
    stopped: bool = False
    parts: dict[int, str] = field(default_factory=dict)  # xxh3 of a part's raw JSON -> ref
    stored: set[str] = field(default_factory=set)  # refs known to be in the store already
    last_turn: str | None = None
    # The last turns recorded, by their token (ex.rewrite.turn; a native view's): (their ref,
    # their request's hashes), for the turn the chain or the view compares the next one with
    # (not always the last recorded).
    recent: dict[object, tuple[str, list[int]]] = field(default_factory=dict)
    last_lists: dict[str, list[int]] = field(default_factory=dict)
    # Context tokens by (wire, a part's hash or a body rest's ref): each part measured once.
    tokens: dict[tuple[str, int | str], int] = field(default_factory=dict)
    line: MainLine = field(default_factory=MainLine)  # which calls are side calls

    def size(self) -> int:
        lists = [*self.last_lists.values(), *(hashes for _, hashes in self.recent.values())]
        parts = 90 * (len(self.parts) + len(self.stored)) + 100 * len(self.tokens)
        return 200 + parts + 8 * sum(map(len, lists))


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
        conversations: Mapping[str, Conversation],
        measure: ContextMeasure,
    ) -> None:
        self.store = store
        self.conversations = conversations  # by wire name: how its bodies read (the timeline)
        self.measure = measure  # context tokens, as replay counts them
        # Sessions' turns not recorded, waiting for their one call to the index.
        self._unlisted = ListingBatch(
            store.put_listed, log, "recording", UNLISTED_SESSIONS, LINGER_S
        )
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
            blobs, listed = self._prepare(turn, known)
        except Exception as exc:
            self._failed(exc, {session: 1})
            self._known.pop(session, None)
            return
        if blobs:
            size = sum(len(data) for _, data in blobs)
            self._enqueue(_Prepared(session, turn.ex.identity.owner, blobs, size, listed))

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
        await self._unlisted.flush()

    async def close(self, wait_s: float = 5.0) -> None:
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self.flush(), wait_s)
        except TimeoutError:
            warn_limited(log, "recording.close", "recording: turns still queued were lost")
        self._task.cancel()
        self._task = None
        await self._unlisted.close(0.0)  # what flush did not see written in time

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
        by_owner: dict[str, Blobs] = {}
        listed: dict[str, dict[str, Listed]] = {}  # each owner's turns' figures, by record
        sessions: dict[str, dict[str, int]] = {}  # each owner's: turns by session
        await self._read_new(batch)
        for item in batch:
            if isinstance(item, Finished):
                prepared = await self._prepare_queued(item)
                if prepared is None:
                    continue
                item_session, owner, blobs, figures = prepared
            else:
                item_session, owner, blobs = item.session, item.owner, item.blobs
                figures = item.listed
            by_owner.setdefault(owner, []).extend(blobs)
            listed.setdefault(owner, {}).update(figures)
            turns = sessions.setdefault(owner, {})
            turns[item_session] = turns.get(item_session, 0) + 1
        for owner, blobs in by_owner.items():
            try:
                await self.store.put_many(blobs, listed.get(owner))
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
    ) -> tuple[str, str, Blobs, dict[str, Listed]] | None:
        """A turn queued whole: a long answer assembled (in slices), its session's state read
        (from the store, if new), then split."""
        session = turn.ex.identity.session
        try:
            answer = _UNREAD
            known = self._known.get(session)
            if _long_answer(turn) and not (known is not None and known.stopped):
                assemble = self.assemblies[turn.ex.client.wire]
                answer = await answer_in_slices(assemble, turn.body, turn.ex.streamed)
            blobs, listed = self._prepare(turn, await self._session(session), answer)
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
        return (session, turn.ex.identity.owner, blobs, listed) if blobs else None

    def _prepare(
        self, turn: Finished, known: _Known, answer: Any = _UNREAD
    ) -> tuple[Blobs, dict[str, Listed]]:
        """The turn's blobs not yet stored, and its figures for the index by its record's
        ref; its session's state moved past it (undone by forgetting the session should the
        write fail). `answer`: the answer, if assembled."""
        ex = turn.ex
        session = ex.identity.session
        if known.stopped:
            self._count("skipped", session)
            return [], {}
        spec = ex.policy.record
        split = _Split(known, session, matcher(spec.redact_pattern, turn.secrets))
        this, base, shared, key = _lineage(ex)
        received = ex.received if ex.received is not None else _parsed(turn.raw)
        if ex.received is not None:  # the body as parsed, never mutated
            # As far as its list agrees with the turn it was compared with, that turn's
            # hashes are its entries' (not hashed again), if this recording holds that turn.
            prior = known.recent.get(base) if base is not None else None
            keep = shared if prior is not None and _list_key(ex.received) == key else 0
            received = _guarded(received, ex.secrets, keep)
            request = split.body(received, "request", keep, prior)
        else:
            received = _guarded(received, ex.secrets, 0)
            request = split.body(received, "request", 0)
        conversation = self.conversations[ex.client.wire]
        call = CallReading(
            _opens(conversation, received, request),
            shared > 0,
            lambda: _opening(conversation, received),
        )
        opens, side = call.counted(known.line, not known.turns)
        sent = split.body(ex.sent, "sent", 0)
        tokens_received = self._tokens(known, split, ex.client.wire, received)
        tokens_sent = self._tokens(known, split, _sent_wire(ex), ex.sent)
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
            "error": _error(turn, conversation, split.redaction),
            # The client's protocol headers (Anthropic's version and betas: the request's
            # meaning depends on them); never its credentials.
            "headers": split.redaction.value(dict(ex.client.forward_headers)) or None,
            "events": events,
            "usage": None if usage is None else usage.described(),
            "cost_usd": ex.accounting.cost_usd,
            "model": ex.alias,
            "at": round(turn.at, 3),
            "turn": known.turns + opens,
            "opens": opens,
            "side": side,
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
            return [], {}
        owner = ex.identity.owner
        blobs = [
            (BlobInfo(ref, session, RECORD_PART, len(part), turn.at, owner), part)
            for ref, part in writes.items()
        ]
        ref = content_ref(session, RECORD_TURN, data)
        meta = {"seq": known.seq, "turn": record["turn"]}
        blobs.append((BlobInfo(ref, session, RECORD_TURN, len(data), turn.at, owner, meta), data))
        known.stored.update(writes)
        known.bytes += adding
        known.seq += 1
        known.turns = record["turn"]
        known.last_turn = ref
        if this is not None:
            known.recent[this] = (ref, split.hashes.get("request", []))
            if len(known.recent) > RECENT_TURNS:
                del known.recent[next(iter(known.recent))]
        known.last_lists = split.hashes
        if split.parts:
            known.parts.update(split.parts)
            self._known[session] = known  # it grew: the memo weighs it again
        key_name = ex.identity.key.name if ex.identity.key is not None else None
        listed = Listed(
            session, ex.identity.session_name, owner, key_name, ex.alias, ex.policy.name,
            turns=1 if opens else 0, calls=1,
            tokens_received=tokens_received, tokens_sent=tokens_sent,
            prompt_tokens=usage.prompt_tokens if usage is not None else 0,
            completion_tokens=usage.completion_tokens if usage is not None else 0,
            cost_usd=ex.accounting.cost_usd, statuses={str(turn.status): 1},
            first_at=turn.at, last_at=turn.at,
        )  # fmt: skip
        return blobs, {ref: listed}

    def _tokens(self, known: _Known, split: _Split, wire: str, body: Any) -> int:
        """The body's context tokens (as replay measures them): its parts' counts, each part
        measured once in the session (a turn measures its new messages only)."""
        held = split.held(body)
        if held is None:
            return 0
        key, items, rest_ref, digests = held
        counts = known.tokens
        rest = counts.get((wire, rest_ref))
        if rest is None:
            rest_body = {k: v for k, v in body.items() if k != key}
            rest = counts[(wire, rest_ref)] = self.measure.rest_tokens(wire, rest_body)
        total = rest
        if len(digests) != len(items):  # not hashed (never so far): measured whole
            return total + sum(self.measure.entry_tokens(wire, item) for item in items)
        for item, digest in zip(items, digests, strict=True):
            count = counts.get((wire, digest))
            if count is None:
                count = counts[(wire, digest)] = self.measure.entry_tokens(wire, item)
            total += count
        return total

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
                known.turns = max(known.turns, int(info.meta.get("turn") or 0))
        self._known[session] = known
        return known

    def _count(self, outcome: str, session: str, turns: int = 1) -> None:
        """Turns of `session` not recorded, and why: the metric, the session's own count on
        the board and, a moment later, in the index."""
        self.metrics.child(self.metrics.recorded_turns, outcome).inc(turns)
        if self.on_unrecorded is not None:
            self.on_unrecorded(session, outcome, turns)
        now = time.time()
        owner = session_owner(session)
        name = session.partition("/")[2] or session
        entry = Listed(session, name, owner, calls=turns, not_recorded={outcome: turns},
                       first_at=now, last_at=now)  # fmt: skip
        self._unlisted.add(entry)


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

    def held(self, body: Any) -> tuple[str | None, list[Any], str, list[int]] | None:
        """A body split this turn: its list's key, entries, rest's ref and entries' hashes."""
        split = self._bodies.get(id(body))
        if split is None:
            return None
        _, key, items, rest_ref, _ = split
        hashes = self._lists.get(id(items))
        return key, items, rest_ref, hashes if hashes is not None else []

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


def _opens(conversation: Conversation, body: Any, request: dict[str, Any] | None) -> bool:
    """Whether the turn's new entries (those past the prefix it shares with the turn it was
    compared with) open a client turn; a body without a list is a prompt of its own."""
    if not isinstance(body, dict) or request is None or request.get("key") is None:
        return True
    return opens_in(conversation, body[request["key"]], request["keep"])


def _opening(conversation: Conversation, body: Any) -> Opening:
    if not isinstance(body, dict):
        return None, None
    key = _list_key(body)
    return opening(conversation, body, body[key] if key is not None else None)


def read_call(ex: Exchange, conversation: Conversation) -> CallReading:
    """A call read as its recording would count it, without the recording: its native
    entries past the prefix its view (or, for chat, the chain) found equal to the session's
    last call's (`_lineage`), read by the wire's Conversation from the last back; a body
    without a list is a prompt of its own. What the sessions board counts (every session,
    recorded or not), on the request's path: the new entries only (and the opening, for a
    call that does not continue the one before it)."""
    _, _, shared, key = _lineage(ex)
    native = ex.client.native
    if native is None:  # the client's chat messages, as received (the stages replace them)
        original = ex.client.original_messages
        items = original if original is not None else ex.body.get(key)
        body: Any = ex.body  # for its fields outside the list (chat has none it reads)
    else:
        body = getattr(native, "body", None)
        items = body.get(key) if isinstance(body, dict) else None
    if not isinstance(items, list):
        return CallReading(True, shared > 0, lambda: (None, None))
    prompt = opens_in(conversation, items, shared)
    return CallReading(prompt, shared > 0, lambda: opening(conversation, body, items))


def _error(turn: Finished, conversation: Conversation, redaction: Redaction) -> Any:
    """A failed turn's status, who said so and what: the proxy's own error, a stream that
    failed after it began, else the error envelope the client got (the upstream's, in the
    client's wire). None for a turn that did not fail."""
    stream = next((n for n in turn.ex.notes if (n.stage, n.action) == ("stream", "failed")), None)
    if turn.error is not None:
        found = {**turn.error, "by": "proxy"}
    elif stream is not None:
        found = {"status": stream.fields.get("status", turn.status), "by": "stream",
                 "message": stream.fields.get("message")}  # fmt: skip
    elif turn.status == CLIENT_GONE:
        found = {"status": turn.status, "by": "client",
                 "message": "the client left before the answer was complete"}  # fmt: skip
    elif turn.status >= 400:
        reply = _parsed(turn.body)
        said = conversation.error(reply) if isinstance(reply, dict) else None
        if said is None and turn.body:
            said = turn.body[: ERROR_CHARS * 2].decode("utf-8", "replace")
        found = {"status": turn.status, "by": "upstream", "message": said}
    else:
        return None
    if isinstance(found.get("message"), str):
        found["message"] = cut(found["message"], ERROR_CHARS)
    return redaction.value(orjson.loads(orjson.dumps(found, default=str)))


def _sent_wire(ex: Exchange) -> str:
    """The wire the body last sent upstream is in: the deployment's native one, else chat."""
    deployment = ex.deployment
    if deployment is None:
        return ex.client.wire
    renderer = ex.client.renderer
    if renderer is not None and not renderer.native_for(deployment):
        return CHAT
    return ex.wire_for(deployment)


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


def _guarded(body: Any, secrets: Mapping[str, str] | None, keep: int) -> Any:
    """The body with the secrets the guard scrubbed replaced by their placeholders, as the
    provider saw it; its first `keep` entries are the recorded turn's already (not walked)."""
    if not secrets or not isinstance(body, dict):
        return with_placeholders(body, secrets)
    key = _list_key(body)
    if key is None:
        return with_placeholders(body, secrets)
    entries: list[Any] = body[key]
    rest = {k: v for k, v in body.items() if k != key}
    out = with_placeholders(rest, secrets)
    new = entries[keep:]
    tail = with_placeholders(new, secrets)
    if out is rest and tail is new:
        return body
    return {**out, key: entries[:keep] + tail}


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


def _parsed(raw: bytes | None) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
