"""The sessions inspector's data: GET /admin/sessions (live and recent sessions) and
GET /admin/sessions/{id} (one session's timeline).

Who may ask: the admin key (or, on a proxy with no keys at all, its local user: a loopback
client naming the proxy, proxy/http/auth.py) sees every tenant's sessions; a client key sees
its own owner's only (its key's, or its team's), and another's session id answers as an unknown
one. With API keys and no admin key, nobody sees every tenant's: recorded bodies go only to
the key that owns them. The list is the store's index of recorded sessions (proxy/store/
listing.py: every replica's, also after a restart) with this process's board
(proxy/sessions/board.py) for the sessions not recorded; a session whose policy records it
reads its timeline from the store (proxy/recording/reader.py), any other its last turns from
the board. A timeline comes in
pages (?after=TURN&limit=N; `has_more`, `next_after`): only a page's turns are expanded, and a
page stops at PAGE_BYTES, so reading any recorded session costs about a page of memory.

A timeline row is one call (the agent's request, with the recall rounds and retries inside
it), numbered `call`; it also says which client turn it belongs to (`turn`: a person's
prompt opens one, `opens`; the board reads it as the recording does), and a recorded row reads
as a conversation, in one shape for every wire
(proxy/recording/conversation.py): `messages_in` (the messages new in it, as the client sent
them), `answer` and, when it failed, `error`. Its events say whether an earlier call already
had them (`new`: a rewrite re-applied to the same old messages is carried, not new).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import aclosing, suppress
from typing import Any

import orjson
from aiohttp import web

from proxy.errors import BadRequest, NotFound, ServiceUnavailable, Unauthorized
from proxy.http.auth import is_local, presented_key
from proxy.recording import conversation as said
from proxy.recording.conversation import Conversation
from proxy.recording.reader import RecordedTurn, Recording
from proxy.sessions.board import SessionSummary
from proxy.sessions.identity import MAX_SESSION_CHARS, owner_of, scoped
from proxy.state import BOARD, CONFIG, RECORDINGS, SHARED_BOARD, STORE, TIMELINE_READS
from proxy.store.base import Store, StoreError
from proxy.store.listing import LISTED_MAX, Listed, fair
from proxy.store.shares import session_owner

routes = web.RouteTableDef()
CHARS_PER_TOKEN = 4  # as the board estimates context tokens
SEEN_CHARS = 8_000  # of the text the model saw in place of an archived item
DEFAULT_TURNS = 100  # a timeline page's turns, unless ?limit= says
MAX_TURNS = 1000  # and at most
PAGE_BYTES = 4 * 1024 * 1024  # a page's rows stop past this (bodies with ?full=1), after one
PAGES_AT_ONCE = 2  # recorded timeline pages built at once (each holds its page and its part cache)
# What an event names (archived refs, tool call ids): one an earlier call named too is carried.
NAMED = ("ref", "refs", "tool_call_ids")
LIST_FLUSH_S = 1.0  # how long a list waits for this process's finished turns to be written
SEEN_NAMES = 50_000  # names remembered while a page walks the calls before it


@routes.get("/admin/sessions")
async def list_sessions(request: web.Request) -> web.Response:
    """The caller's sessions, most recent first: the recorded ones from the store's index,
    the others from this process's board. `?session=NAME`: those of that name only (for a
    key, its own one: read from the index by its scoped name, however old)."""
    scope = _scope(request)
    name = request.query.get("session")
    if name is not None and not 0 < len(name) <= MAX_SESSION_CHARS:
        raise BadRequest(f"'session' must be a session name of 1 to {MAX_SESSION_CHARS} characters")
    board = {
        s.session: s
        for s in request.app[BOARD].sessions()
        if (scope is None or s.owner == scope) and (name is None or s.name == name)
    }
    store = request.app[STORE]
    # Read your writes: the turns this process finished are in the index before it is read
    # (the writer lingers to batch them), within a bound; past it, the board's figures show.
    with suppress(TimeoutError):
        await asyncio.wait_for(_flushed(request.app), LIST_FLUSH_S)
    try:
        if name is not None and scope is not None:
            one = await store.listed_one(scoped(scope, name))
            listed = [one] if one is not None else []
        else:
            listed = await store.listed(scope, LISTED_MAX)
    except StoreError:
        listed = []  # the store is down: what this process served is still listed
    rows: dict[str, dict[str, Any]] = {}
    recency: dict[str, float] = {}  # by session: its last activity, unrounded (the order)
    for entry in listed:
        if name is None or entry.name == name:
            summary = board.get(entry.session)
            rows[entry.session] = _listed(entry, summary)
            recency[entry.session] = _last_at(entry, summary)
    for session, summary in board.items():
        if session not in rows:
            rows[session] = {**_describe(summary), "source": "board"}
            recency[session] = summary.last_at
    return _json({"object": "list", "data": _shared(rows, recency)})


async def _flushed(app: web.Application) -> None:
    """The calls this process finished, in the index: recorded ones, and on a shared store the
    others too."""
    await app[RECORDINGS].flush()
    shared = app.get(SHARED_BOARD)
    if shared is not None:
        await shared.flush()


def _shared(rows: dict[str, dict[str, Any]], recency: dict[str, float]) -> list[dict[str, Any]]:
    """At most LISTED_MAX rows, each owner its share (store/listing.py `fair`), most recent
    first: ordered by the times themselves, not the rows' rounded ones (calls a millisecond
    apart would tie, and the tie would fall to whichever source listed them)."""
    owners: dict[str, list[tuple[str, float]]] = {}
    for session in sorted(rows, key=lambda session: -recency[session]):
        owners.setdefault(rows[session]["owner"], []).append((session, recency[session]))
    kept = fair(list(owners.values()), LISTED_MAX)
    return [rows[session] for session in sorted(kept, key=lambda s: -recency[s])]


def _last_at(entry: Listed, summary: SessionSummary | None) -> float:
    """A recorded session's last activity: its index entry's, or the board's when this
    process finished a later call the writer has not put in the index yet (a session whose
    newest call is on its way is listed as recent as it is, not where its last write left
    it). Both are the call's one time (board.py `saw`)."""
    return max(entry.last_at, summary.last_at if summary is not None else 0.0)


@routes.get("/admin/sessions/{id}")
async def show_session(request: web.Request) -> web.Response:
    scope = _scope(request)
    session = _session_of(request.match_info["id"])
    if session is None or (scope is not None and session_owner(session) != scope):
        raise NotFound(f"no session '{request.match_info['id']}' for this key")
    after, limit = _page_asked(request.query)
    full = request.query.get("full") in ("1", "true")
    summary = request.app[BOARD].get(session)
    page: Page = ([], False, None)
    last = None
    try:
        async with request.app[TIMELINE_READS]:
            recording = await Recording.open(request.app[STORE], session)
            if recording:
                conversations = request.app[RECORDINGS].conversations
                page = await _recorded_page(recording, after, limit, full, conversations)
                last = await recording.last() if summary is None else None
    except StoreError as exc:
        raise ServiceUnavailable(
            f"the store is unavailable: {exc}", code="store_unavailable"
        ) from exc
    entry = await _entry(request.app[STORE], session, recording)
    if not recording:
        if summary is None and entry is None:
            raise NotFound(f"no session '{request.match_info['id']}' for this key")
        # The board's last calls when served here; another replica's are not kept.
        page = _board_page(summary, after, limit) if summary is not None else ([], False, None)
    body = _described(session, summary, recording, last, entry)
    if not recording:
        body["source"] = "board" if entry is None else "index"
    else:
        body["source"] = "recording"
    # Client turns apart from the calls in them (the board's and the index's count both).
    body["calls"] = len(recording) if recording else body.get("calls")
    if recording and recording.client_turns() is not None:
        body["turns"] = recording.client_turns()
    body["timeline"], body["has_more"], body["next_after"] = page
    body["limit"] = limit
    return _json(body)


def _scope(request: web.Request) -> str | None:
    """None: the caller sees every session (admin); else the owner whose sessions it sees.
    A key that is neither the admin key nor an API key is refused, loopback or not; so is no
    key once the proxy has any."""
    keys = request.app[CONFIG].current.keys
    secret = presented_key(request)
    if secret is not None and keys.is_admin(secret):
        return None
    key = keys.find(secret) if secret is not None else None
    if key is not None:
        return owner_of(key, keys)
    if secret is None and not keys.api_keys and keys.admin_digest is None and is_local(request):
        return None  # a proxy with no keys at all: its local user sees everything
    raise Unauthorized("session routes need 'Authorization: Bearer <admin key or API key>'")


def session_id(session: str) -> str:
    """The id a scoped session is listed under (URL-safe; its owner is checked on use)."""
    return base64.urlsafe_b64encode(session.encode()).decode().rstrip("=")


def _session_of(ident: str) -> str | None:
    try:
        padded = ident + "=" * (-len(ident) % 4)
        return base64.urlsafe_b64decode(padded.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def _describe(summary: SessionSummary) -> dict[str, Any]:
    return {
        "id": session_id(summary.session),
        "session": summary.name,
        "owner": summary.owner,
        "key": summary.key,
        "model": summary.model,
        "policy": summary.policy,
        "recorded": summary.recorded,
        "turns": summary.turns,  # client turns, as the index counts them
        "calls": summary.calls,
        "tokens_received": summary.tokens_received,
        "tokens_sent": summary.tokens_sent,
        "prompt_tokens": summary.prompt_tokens,
        "completion_tokens": summary.completion_tokens,
        "cost_usd": None if summary.cost_usd is None else round(summary.cost_usd, 6),
        "errors": summary.errors,
        "first_at": round(summary.first_at, 3),
        "last_at": round(summary.last_at, 3),
        "guard": summary.guard,
        "not_recorded": summary.not_recorded,
    }


async def _entry(store: Store, session: str, recording: Recording) -> Listed | None:
    """The session's index entry: a recorded one's, or on a shared store one no policy records
    (every replica's calls); None when the store is down (the board's figures show then)."""
    if not recording and not store.shared:
        return None  # one process: its board has every call of it
    with suppress(StoreError):
        return await store.listed_one(session)
    return None


def _described(
    session: str,
    summary: SessionSummary | None,
    recording: Recording,
    last: dict[str, Any] | None,
    entry: Listed | None,
) -> dict[str, Any]:
    """A session's row as the list has it: from the index when there, else the board's."""
    if entry is not None:
        return _listed(entry, summary)
    return _describe(summary) if summary is not None else _unlisted(session, recording, last)


def _listed(entry: Listed, summary: SessionSummary | None) -> dict[str, Any]:
    """A session from the store's index: every replica's turns; a recorded one's context
    tokens as replay measures them, another's as the boards estimate them (`source`: index);
    its guard record from this process's board, if served here."""
    return {
        "id": session_id(entry.session),
        "session": entry.name,
        "owner": entry.owner,
        "key": entry.key,
        "model": entry.model,
        "policy": entry.policy,
        "recorded": entry.recorded,
        "turns": entry.turns,
        "calls": entry.calls,
        "tokens_received": entry.tokens_received,
        "tokens_sent": entry.tokens_sent,
        "prompt_tokens": entry.prompt_tokens,
        "completion_tokens": entry.completion_tokens,
        "cost_usd": None if entry.cost_usd is None else round(entry.cost_usd, 6),
        "errors": entry.errors,
        "statuses": entry.statuses,
        "first_at": round(entry.first_at, 3),
        "last_at": round(_last_at(entry, summary), 3),
        "guard": summary.guard if summary is not None else {},
        "not_recorded": entry.not_recorded,
        "source": "recording" if entry.recorded else "index",
    }


def _unlisted(session: str, recording: Recording, last: dict[str, Any] | None) -> dict[str, Any]:
    """A recorded session this process has not served (another replica, before a restart)."""
    owner, _, name = session.partition("/")
    last = last or {}
    return {
        "id": session_id(session),
        "session": name,
        "owner": owner,
        "model": last.get("model"),
        "recorded": True,
        "turns": recording.client_turns() or len(recording),
        "calls": len(recording),
        "last_at": last.get("at"),
    }


Page = tuple[list[Any], bool, int | None]  # rows, whether more follow, the `after` for them


def _page_asked(query: Mapping[str, str]) -> tuple[int, int]:
    """?after=TURN (the rows start past it; 0, the default: from the first) and ?limit=N
    (DEFAULT_TURNS unless given; past MAX_TURNS, MAX_TURNS)."""
    after = _count(query, "after", 0, 0)
    return after, min(_count(query, "limit", DEFAULT_TURNS, 1), MAX_TURNS)


def _count(query: Mapping[str, str], name: str, default: int, least: int) -> int:
    text = query.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or int(text) < least:
        raise BadRequest(f"'{name}' must be a whole number, at least {least}; got {text!r:.40}")
    return int(text)


async def _recorded_page(
    recording: Recording,
    after: int,
    limit: int,
    full: bool,
    conversations: Mapping[str, Conversation],
) -> Page:
    """Up to `limit` calls past `after`, expanded one at a time and each kept as its JSON:
    the page stops early, after at least one call, where it would pass PAGE_BYTES. The calls
    before it are walked for what their events named (bounded: SEEN_NAMES)."""
    rows: list[Any] = []
    used, last = 0, after
    seen: OrderedDict[tuple[str, ...], None] = OrderedDict()
    async with aclosing(recording.turns()) as turns:
        async for turn in turns:
            if turn.number <= after:
                _carried(turn.record.get("events") or [], seen)
                continue
            if len(rows) == limit:
                return rows, True, last
            if full and rows:  # what its bodies will weigh, known before they are built
                weight = sum(recording.size(turn, which) or 0 for which in ("request", "sent"))
                if used + weight > PAGE_BYTES:
                    return rows, True, last
            conversation = conversations.get(turn.record.get("wire") or "")
            row = orjson.dumps(await _recorded(recording, turn, full, conversation, seen))
            if rows and used + len(row) > PAGE_BYTES:
                return rows, True, last
            rows.append(orjson.Fragment(row))
            used, last = used + len(row), turn.number
    return rows, False, None


def _board_page(summary: SessionSummary, after: int, limit: int) -> Page:
    """The board's last calls, numbered as the session counts them."""
    first = summary.calls - len(summary.timeline) + 1
    numbered = [{"call": first + i, **row} for i, row in enumerate(summary.timeline)]
    rows = [row for row in numbered if row["call"] > after]
    more = len(rows) > limit
    return rows[:limit], more, rows[limit - 1]["call"] if more else None


async def _recorded(
    recording: Recording,
    turn: RecordedTurn,
    full: bool,
    conversation: Conversation | None,
    seen: OrderedDict[tuple[str, ...], None],
) -> dict[str, Any]:
    """A recorded call as a timeline row: its number and its client turn's, context in and
    out (from the stored parts' sizes: the bodies are not built for it), the conversation
    (its new messages, the answer, the error), events (new or carried; a summary with the
    summarizer's text as the model saw it, an offload with its pointer), errors; with
    ?full=1 the bodies too. Fields a row adds go here, read from `turn` and its parts."""
    record = turn.record
    raw_events = record.get("events") or []
    news = _carried(raw_events, seen)
    events = [
        {**await _with_seen(recording, turn, e), **new}
        for e, new in zip(raw_events, news, strict=True)
    ]
    row = {
        "call": turn.number,
        "turn": record.get("turn"),
        "opens": record.get("opens"),
        "side": bool(record.get("side")),
        "at": record.get("at"),
        "status": record.get("status"),
        "model": record.get("model"),
        "context": {
            "received": (recording.size(turn, "request") or 2) // CHARS_PER_TOKEN,
            "sent": _tokens(recording.size(turn, "sent")),
        },
        "usage": record.get("usage"),
        "events": events,
        "errors": [e for e in events if e.get("stage") in ("error", "stream")],
        "error": record.get("error"),
    }
    if conversation is not None:
        row.update(await _conversation(recording, turn, conversation))
    if full:
        row["request"] = await recording.body(turn, "request") or {}
        row["sent"] = await recording.body(turn, "sent")
        row["answer"] = record.get("answer")
    return row


async def _conversation(
    recording: Recording, turn: RecordedTurn, conversation: Conversation
) -> dict[str, Any]:
    """The call's new messages as its client sent them (those past the prefix it shares with
    the call it was compared with; when all are new, the system prompt or instructions too)
    and its answer, bounded (conversation.py): `messages_omitted` says how many were left out.
    Only the new messages' parts are read, and at most MESSAGES_SHOWN of them."""
    shape = turn.record.get("request")
    messages: list[said.Message] = []
    omitted = 0
    if isinstance(shape, dict):
        if not shape.get("base") or not shape.get("key"):
            rest = await recording.part(shape["body"])
            if isinstance(rest, dict):
                messages += conversation.outside(rest)
        refs = list(shape.get("new") or []) if shape.get("key") else []
        omitted = max(0, len(refs) - said.MESSAGES_SHOWN)
        items = [await recording.part(ref) for ref in refs[omitted:]]
        messages += conversation.messages(items)
    shown, left = said.bounded(messages)
    reply = turn.record.get("answer")
    answer = conversation.answer(reply) if isinstance(reply, dict) else None
    return {
        "messages_in": shown,
        "messages_omitted": omitted + left,
        "answer": said.bounded_answer(answer),
    }


def _carried(events: list[Any], seen: OrderedDict[tuple[str, ...], None]) -> list[dict[str, Any]]:
    """For each event, whether it is new: an event that names what it acted on (NAMED) is
    carried when every name was named by an earlier call's event of the same stage (an
    offload of the same result, a summary's checkpoint reused: `carried` says how many
    were); one that names nothing is new. `seen` learns them."""
    marks: list[dict[str, Any]] = []
    for event in events:
        if not isinstance(event, dict):
            marks.append({})
            continue
        stage = str(event.get("stage"))
        names = [(stage, n) for n in _names(event)]
        carried = sum(name in seen for name in names)
        marks.append({"new": not names or carried < len(names), "carried": carried})
        for name in names:
            seen[name] = None
            seen.move_to_end(name)
        while len(seen) > SEEN_NAMES:
            seen.popitem(last=False)
    return marks


def _names(event: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for field in NAMED:
        value = event.get(field)
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            found += [item for item in value if isinstance(item, str)]
    return found


def _tokens(size: int | None) -> int | None:
    return None if size is None else size // CHARS_PER_TOKEN


async def _with_seen(
    recording: Recording, turn: RecordedTurn, event: dict[str, Any]
) -> dict[str, Any]:
    """The event with what the model saw in place of what it archived: a summary's text as
    `summary`, and for each archived ref (`ref`, `refs`) the text of the request as sent that
    names it (an offload's pointer) in `seen`, at most SEEN_CHARS of each. Only the parts of
    the request as sent that name one are parsed."""
    listed = event.get("refs")
    named = [event.get("ref"), *(listed if isinstance(listed, list) else ())]
    refs = [r for r in named if isinstance(r, str)]
    if not refs or not isinstance(turn.record.get("sent"), dict):
        return event
    found = await recording.naming(turn, "sent", refs)
    out = {**event, "seen": {ref: text[:SEEN_CHARS] for ref, text in found.items()}}
    if event.get("action") == "summarized" and event.get("ref") in found:
        out["summary"] = found[event["ref"]]
    return out


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")
