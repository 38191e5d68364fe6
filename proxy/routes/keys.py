"""Keys at run time, behind the admin key: POST /admin/keys makes one (its secret answered
once), GET /admin/keys lists every key (never a secret or a digest), DELETE
/admin/keys/{name} revokes one, POST /admin/keys/{name}/rotate gives it a new secret. A key
of the configuration's files is changed only there: 409. Every change is audited."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web

from proxy.errors import BadRequest, Conflict, NotFound, StoreUnavailable
from proxy.http.runtime_keys import KeyTaken
from proxy.json_values import nested_too_deep
from proxy.policies.loader import read_api_key
from proxy.policies.spec import ApiKey
from proxy.policies.stored_keys import describe_key
from proxy.routes.admin import require_json
from proxy.routes.admin_auth import admin_caller
from proxy.state import AUDIT, CONFIG, RUNTIME_KEYS
from proxy.store.admin_records import MAX_STORED_KEYS
from proxy.store.base import StoreError
from proxy.wire.body import read_body

routes = web.RouteTableDef()

MAX_KEY_BODY = 16 * 1024  # a name, a team, a few models and limits
MAX_NAME = 64


@routes.get("/admin/keys")
async def list_keys(request: web.Request) -> web.Response:
    await admin_caller(request)
    with contextlib.suppress(StoreError):  # the store down: the keys this process follows
        await request.app[RUNTIME_KEYS].refresh()  # what another replica changed a moment ago
    keys = request.app[CONFIG].current.keys.api_keys
    return _json({"keys": [describe_key(key) for key in keys]})


@routes.post("/admin/keys")
async def create_key(request: web.Request) -> web.Response:
    who = await admin_caller(request)
    require_json(request)
    holder = request.app[CONFIG]
    timeout_s = holder.current.server.body_timeout_s
    raw = await read_body(request, MAX_KEY_BODY, timeout_s)
    key = _checked(raw, set(holder.current.deployments))
    if holder.loaded.keys.named(key.name) is not None:
        raise _configured(key.name)
    try:
        with _store_answers():
            made, secret = await request.app[RUNTIME_KEYS].create(key)
    except KeyTaken:
        raise Conflict(
            f"a key named {key.name!r} exists already (or {MAX_STORED_KEYS} keys are stored): "
            f"rotate it (POST /admin/keys/{key.name}/rotate) or revoke it first",
            param="name",
        ) from None
    described = describe_key(made)
    await request.app[AUDIT].record("key.create", who, request.remote, key=_audited(described))
    return _json({**described, "key": secret}, status=201)


@routes.delete("/admin/keys/{name}")
async def revoke_key(request: web.Request) -> web.Response:
    who = await admin_caller(request)
    name = request.match_info["name"]
    _not_configured(request, name)
    with _store_answers():
        gone = await request.app[RUNTIME_KEYS].revoke(name)
    if not gone:
        raise _missing(name)
    await request.app[AUDIT].record("key.revoke", who, request.remote, key={"name": name})
    return _json({"name": name, "revoked": True})


@routes.post("/admin/keys/{name}/rotate")
async def rotate_key(request: web.Request) -> web.Response:
    who = await admin_caller(request)
    require_json(request)
    name = request.match_info["name"]
    _not_configured(request, name)
    with _store_answers():
        rotated = await request.app[RUNTIME_KEYS].rotate(name)
    if rotated is None:
        raise _missing(name)
    key, secret = rotated
    described = describe_key(key)
    await request.app[AUDIT].record("key.rotate", who, request.remote, key=_audited(described))
    return _json({**described, "key": secret})


@contextlib.contextmanager
def _store_answers() -> Iterator[None]:
    """A change needs the store: without it, 503 with the reason (nothing was changed)."""
    try:
        yield
    except StoreError as exc:
        raise StoreUnavailable(f"keys are kept in the store, which failed: {exc}") from None


def _checked(raw: bytes, aliases: set[str]) -> ApiKey:
    try:
        data = orjson.loads(raw or b"null")
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if nested_too_deep(raw, data):
        raise BadRequest("the body nests too deep")
    key, issues = read_api_key(data, aliases)
    if key is None:
        first = issues[0]
        raise BadRequest(
            "; ".join(f"{i.path or 'body'}: {i.message}" for i in issues[:5]),
            param=first.path or None,
        )
    if len(key.name) > MAX_NAME:
        raise BadRequest(f"name: at most {MAX_NAME} characters", param="name")
    return key


def _not_configured(request: web.Request, name: str) -> None:
    if request.app[CONFIG].loaded.keys.named(name) is not None:
        raise _configured(name)


def _configured(name: str) -> Conflict:
    return Conflict(
        f"key {name!r} is the configuration's (keys.api_keys): edit the YAML to change or "
        "remove it, then reload",
        param="name",
        code="key_in_configuration",
    )


def _missing(name: str) -> NotFound:
    return NotFound(f"no key named {name[:100]!r} was made at run time", param="name")


def _audited(described: dict[str, Any]) -> dict[str, Any]:
    return {k: described[k] for k in ("name", "team", "models", "limits")}


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")
