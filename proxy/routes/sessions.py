"""The sessions inspector's data: GET /admin/sessions (live and recent sessions) and
GET /admin/sessions/{id} (one session's timeline).

Who may ask: the admin key (or, with none configured, any loopback client) sees every
tenant's sessions; a client key sees its own owner's only (its key's, or its team's), and
another's session id answers as an unknown one. The list is this process's board
(proxy/sessions/board.py); a session whose policy records it reads its whole timeline from
the store (proxy/recording/sessions.py), any other its last turns from the board.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson
from aiohttp import web

from proxy.errors import NotFound, ServiceUnavailable, Unauthorized
from proxy.http.auth import is_loopback, presented_key
from proxy.recording.sessions import recorded_turns
from proxy.sessions.board import SessionSummary
from proxy.sessions.identity import owner_of
from proxy.state import BOARD, CONFIG, STORE
from proxy.store.base import StoreError
from proxy.store.shares import session_owner

routes = web.RouteTableDef()
CHARS_PER_TOKEN = 4  # as the board estimates context tokens
SEEN_CHARS = 8_000  # of the text the model saw in place of an archived item


@routes.get("/admin/sessions")
async def list_sessions(request: web.Request) -> web.Response:
    scope = _scope(request)
    mine = [s for s in request.app[BOARD].sessions() if scope is None or s.owner == scope]
    mine.sort(key=lambda s: s.last_at, reverse=True)
    return _json({"object": "list", "data": [_describe(s) for s in mine]})


@routes.get("/admin/sessions/{id}")
async def show_session(request: web.Request) -> web.Response:
    scope = _scope(request)
    session = _session_of(request.match_info["id"])
    if session is None or (scope is not None and session_owner(session) != scope):
        raise NotFound(f"no session '{request.match_info['id']}' for this key")
    summary = request.app[BOARD].get(session)
    full = request.query.get("full") in ("1", "true")
    turns: list[dict[str, Any]] = []
    try:
        recorded = await recorded_turns(request.app[STORE], session)
    except StoreError as exc:
        raise ServiceUnavailable(
            f"the store is unavailable: {exc}", code="store_unavailable"
        ) from exc
    if recorded:
        turns = [_recorded(turn, full) for turn in recorded]
    elif summary is not None:
        turns = list(summary.timeline)
    if summary is None and not recorded:
        raise NotFound(f"no session '{request.match_info['id']}' for this key")
    body = _describe(summary) if summary is not None else _unlisted(session, recorded)
    body["source"] = "recording" if recorded else "board"
    body["timeline"] = turns
    return _json(body)


def _scope(request: web.Request) -> str | None:
    """None: the caller sees every session (admin); else the owner whose sessions it sees.
    A key that is neither the admin key nor an API key is refused, loopback or not."""
    keys = request.app[CONFIG].current.keys
    secret = presented_key(request)
    if secret is not None and keys.is_admin(secret):
        return None
    key = keys.find(secret) if secret is not None else None
    if key is not None:
        return owner_of(key, keys)
    if secret is None and keys.admin_digest is None and is_loopback(request):
        return None  # as every admin route: loopback only, without an admin key
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
        "turns": summary.turns,
        "tokens_received": summary.tokens_received,
        "tokens_sent": summary.tokens_sent,
        "prompt_tokens": summary.prompt_tokens,
        "completion_tokens": summary.completion_tokens,
        "cost_usd": round(summary.cost_usd, 6),
        "errors": summary.errors,
        "first_at": round(summary.first_at, 3),
        "last_at": round(summary.last_at, 3),
        "guard": summary.guard,
        "not_recorded": summary.not_recorded,
    }


def _unlisted(session: str, recorded: list[dict[str, Any]]) -> dict[str, Any]:
    """A recorded session this process has not served (another replica, before a restart)."""
    owner, _, name = session.partition("/")
    last = recorded[-1] if recorded else {}
    return {
        "id": session_id(session),
        "session": name,
        "owner": owner,
        "model": last.get("model"),
        "recorded": True,
        "turns": len(recorded),
        "last_at": last.get("at"),
    }


def _recorded(turn: dict[str, Any], full: bool) -> dict[str, Any]:
    """A recorded turn as a timeline row: context in and out, events (a summary with the
    summarizer's text as the model saw it, an offload with its pointer), errors; with ?full=1
    the bodies too."""
    sent = turn.get("sent")
    events = [_with_seen(event, sent) for event in turn.get("events", [])]
    row = {
        "at": turn.get("at"),
        "status": turn.get("status"),
        "model": turn.get("model"),
        "context": {"received": _tokens(turn.get("request")), "sent": _tokens(sent)},
        "usage": turn.get("usage"),
        "events": events,
        "errors": [e for e in events if e.get("stage") in ("error", "stream")],
    }
    if full:
        row.update({name: turn.get(name) for name in ("request", "sent", "answer")})
    return row


def _tokens(body: Any) -> int | None:
    return None if body is None else len(orjson.dumps(body)) // CHARS_PER_TOKEN


def _with_seen(event: dict[str, Any], sent: Any) -> dict[str, Any]:
    """The event with what the model saw in place of what it archived: a summary's text as
    `summary`, and for each archived ref (`ref`, `refs`) the text of the request as sent that
    names it (an offload's pointer) in `seen`, at most SEEN_CHARS of each."""
    listed = event.get("refs")
    named = [event.get("ref"), *(listed if isinstance(listed, list) else ())]
    refs = [r for r in named if isinstance(r, str)]
    if not refs or sent is None:
        return event
    strings = _strings(sent)
    seen: dict[str, str] = {}
    for ref in refs:
        text = next((t for t in strings if ref in t), None)
        if text is not None:
            seen[ref] = text[:SEEN_CHARS]
    out = {**event, "seen": seen}
    if event.get("action") == "summarized" and event.get("ref") in seen:
        out["summary"] = next(t for t in strings if event["ref"] in t)
    return out


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")
