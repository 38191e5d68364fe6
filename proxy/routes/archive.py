"""Recall for people: read what left the context, by reference, or list a session's archive.

A blob is readable only by the tenant that created it (its key, or its team with
`keys.session_scope: team`), or with the admin key (the inspector at /ui shows every tenant's
sessions to it), and a session id names a session of the caller's own. Someone
else's reference answers exactly like an unknown one, so existence is not revealed.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.errors import NotFound, ServiceUnavailable
from proxy.http.auth import authenticate, presents_admin_key
from proxy.sessions.identity import may_read, name_in_scope, owner_of, scoped
from proxy.state import CONFIG, STORE
from proxy.store.base import RECORDING_KINDS, BlobInfo, StoreError

routes = web.RouteTableDef()


@routes.get("/v1/agentproxy/archive/{ref}")
async def get_archived(request: web.Request) -> web.Response:
    keys = request.app[CONFIG].current.keys
    admin = presents_admin_key(request, keys)  # every tenant's, as /admin/sessions shows them
    key = None if admin else authenticate(request, keys)
    ref = request.match_info["ref"]
    try:
        found = await request.app[STORE].get(ref)
    except StoreError as exc:
        raise _unavailable(exc) from exc
    if (
        found is None
        or found[0].kind in RECORDING_KINDS
        or not (admin or may_read(owner_of(key, keys), key, found[0].owner))
    ):
        raise NotFound(f"no archived content with reference '{ref}' for this API key")
    info, data = found
    if request.query.get("raw") in ("1", "true"):
        return web.Response(body=data, content_type="text/plain", charset="utf-8")
    body = {**_describe(info), "content": data.decode("utf-8", "replace")}
    return _json(body)


# `.+` lets a session id contain "/" (clients send it percent-encoded).
@routes.get("/v1/agentproxy/sessions/{session:.+}/archive")
async def list_archived(request: web.Request) -> web.Response:
    keys = request.app[CONFIG].current.keys
    key = authenticate(request, keys)
    session = request.match_info["session"]
    owner = owner_of(key, keys)
    try:  # the caller's own session, and what its key stored before sessions were scoped
        store = request.app[STORE]
        blobs = [*await store.blobs(scoped(owner, session)), *await store.blobs(session)]
    except StoreError as exc:
        raise _unavailable(exc) from exc
    mine = sorted(
        (b for b in blobs if b.kind not in RECORDING_KINDS and may_read(owner, key, b.owner)),
        key=lambda b: (b.created_at, b.ref),
        reverse=True,
    )
    return _json({"object": "list", "session": session, "data": [_describe(b) for b in mine]})


def _describe(info: BlobInfo) -> dict[str, Any]:
    return {
        "ref": info.ref,
        "session": name_in_scope(info.session) if _scoped(info) else info.session,
        "kind": info.kind,
        "size": info.size,
        "created_at": info.created_at,
        "meta": info.meta,
    }


def _scoped(info: BlobInfo) -> bool:
    """Stored under a scoped session (owners then hold a ":"), not before scoping existed."""
    return info.owner is not None and ":" in info.owner


def _unavailable(exc: StoreError) -> ServiceUnavailable:
    return ServiceUnavailable(f"the archive store is unavailable: {exc}", code="store_unavailable")


def _json(body: dict[str, Any]) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json")
