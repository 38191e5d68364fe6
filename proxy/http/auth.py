"""Who is calling: proxy API keys and the admin key.

With no API keys configured the proxy is open to loopback clients only; with no admin key, the
admin routes are. Both cases are warned about loudly at start-up.
"""

from __future__ import annotations

import ipaddress

from aiohttp import web

from proxy.errors import Unauthorized
from proxy.policies.spec import ApiKey, Keys

_LOOPBACK_LITERALS = frozenset({"127.0.0.1", "::1"})


def presented_key(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return request.headers.get("x-api-key") or None


def is_loopback(request: web.Request) -> bool:
    remote = request.remote
    if not remote:
        return False
    if remote in _LOOPBACK_LITERALS:
        return True
    try:
        return ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def authenticate(request: web.Request, keys: Keys) -> ApiKey | None:
    """The caller's ApiKey, None when the proxy is open (no keys, loopback), else 401."""
    if not keys.api_keys:
        if is_loopback(request):
            return None
        raise Unauthorized(
            "no API keys are configured, so only loopback clients are served; "
            "add keys.api_keys to the configuration"
        )
    secret = presented_key(request)
    if secret is None:
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer <key>' with a key from keys.api_keys"
        )
    key = keys.find(secret)
    if key is None:
        raise Unauthorized("invalid API key")
    return key


def authenticate_admin(request: web.Request, keys: Keys) -> None:
    if keys.admin_digest is None:
        if is_loopback(request):
            return
        raise Unauthorized(
            "no admin key is configured, so admin routes serve loopback clients only; "
            "set keys.admin_key"
        )
    secret = presented_key(request)
    if secret is None or not keys.is_admin(secret):
        raise Unauthorized("admin routes need 'Authorization: Bearer <admin key>'")


def presents_admin_key(request: web.Request, keys: Keys) -> bool:
    """Whether the caller presents the configured admin key (on a route that also serves API
    keys: there, no admin key configured means no caller is the admin)."""
    secret = presented_key(request)
    return secret is not None and keys.is_admin(secret)
