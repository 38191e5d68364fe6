"""Who is calling an admin route: the admin key's holder, or the local user when no admin key
is configured. A refused caller is audited (`admin.auth_failed`): the route and the address,
never what it presented; past a few a minute, counted and summed up instead
(proxy/recording/auth_failures.py), so refusals cannot crowd out the audit or the log."""

from __future__ import annotations

from aiohttp import web

from proxy.errors import Unauthorized
from proxy.http.auth import authenticate_admin, presented_key
from proxy.state import AUTH_FAILURES, CONFIG

ADMIN = "admin_key"  # who an entry names for the configured admin key's holder
LOOPBACK = "loopback"  # the local user, when no admin key is configured


async def admin_caller(request: web.Request) -> str:
    keys = request.app[CONFIG].current.keys
    try:
        authenticate_admin(request, keys)
    except Unauthorized:
        await request.app[AUTH_FAILURES].refused(
            request.remote,  # the peer's address: forwarded headers are not trusted
            method=request.method,
            path=request.path,  # without its query: a key may be sent there
            presented_key=presented_key(request) is not None,
        )
        raise
    return ADMIN if keys.admin_digest is not None else LOOPBACK


def actor(request: web.Request, who: str) -> dict[str, str]:
    """Who asked, as a reload's listeners are told."""
    return {"who": who, "from": request.remote or ""}
