"""GET /admin/audit: the audit of admin actions (proxy/recording/audit.py), behind the admin
key, a page at a time: ?order=newest (the default) or oldest, ?after=ID (the page starts past
that entry in that order), ?limit=N; `has_more` and `next_after` give the next page."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.errors import BadRequest, StoreUnavailable
from proxy.routes.admin_auth import admin_caller
from proxy.state import AUDIT
from proxy.store.base import StoreError

routes = web.RouteTableDef()

DEFAULT_ENTRIES = 100
MAX_ENTRIES = 1000


@routes.get("/admin/audit")
async def audit(request: web.Request) -> web.Response:
    await admin_caller(request)
    order = request.query.get("order", "newest")
    if order not in ("newest", "oldest"):
        raise BadRequest(f"order: 'newest' or 'oldest', not {order[:40]!r}", param="order")
    after = _count(request, "after", None)
    limit = min(_count(request, "limit", DEFAULT_ENTRIES) or DEFAULT_ENTRIES, MAX_ENTRIES)
    records = request.app[AUDIT].records
    try:
        entries = await records.audit(after, limit + 1, "newest" if order == "newest" else "oldest")
    except StoreError as exc:
        raise StoreUnavailable(f"the audit is kept in the store, which failed: {exc}") from None
    more = len(entries) > limit
    entries = entries[:limit]
    body: dict[str, Any] = {
        "entries": entries,
        "order": order,
        "limit": limit,
        "has_more": more,
        "next_after": entries[-1]["id"] if more else None,
    }
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def _count(request: web.Request, name: str, default: int | None) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return default
    least = 1 if name == "limit" else 0
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 15 or int(raw) < least:
        raise BadRequest(f"{name}: a whole number, at least {least}; got {raw!r:.40}", param=name)
    return int(raw)
