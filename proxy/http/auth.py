"""Who is calling: proxy API keys and the admin key, and the local user.

With no API keys configured the proxy is open to the local user only; with no admin key, the
admin routes are (and with API keys, recorded content goes only to the key that owns it: see
proxy/routes/sessions.py). Both cases are warned about loudly at start-up. The local user is a
loopback client that names the proxy in its `Host` (not a page of another site whose name was
pointed at 127.0.0.1: DNS rebinding); and no request sent by another site's page is served at
all (its `Origin`), whatever it carries.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import hdrs, web
from yarl import URL

from proxy.errors import Forbidden, Unauthorized
from proxy.policies.spec import ApiKey, Keys, ServerSettings

_LOOPBACK_LITERALS = frozenset({"127.0.0.1", "::1"})
_LOOPBACK_NAMES = frozenset({"localhost", *_LOOPBACK_LITERALS})
# A bind address that names no host: every interface.
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


class HostNames:
    """The names a loopback client may call the proxy by when it sends no key: the loopback
    names (`localhost`, `*.localhost`, loopback addresses), server.host and the address bound
    (`--host`) unless they bind every interface, and server.allowed_hosts; any port."""

    def __init__(self, server: Callable[[], ServerSettings], bound: str | None = None) -> None:
        self._server = server  # read on use: allowed_hosts follows a reload
        self._bound = bound

    def serves(self, host: str | None) -> bool:
        if host is None:
            return True  # no Host at all (HTTP/1.0, a raw socket): never a browser's request
        name, _ = split_host(host)
        if is_loopback_name(name):
            return True
        server = self._server()
        if name in server.allowed_hosts:
            return True
        bound = (server.host, self._bound)
        return any(
            b is not None and b not in _WILDCARDS and split_host(b)[0] == name for b in bound
        )


HOST_NAMES = web.AppKey("host_names", HostNames)


def split_host(host: str) -> tuple[str, int | None]:
    """A Host header's name (lowercase, without brackets or a final dot) and port."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif host.count(":") > 1:
        name, port = host, ""  # a bare IPv6 address (a bind address, never a valid Host)
    else:
        name, _, port = host.partition(":")
    return name.rstrip(".").lower(), int(port) if port.isdigit() and len(port) <= 5 else None


def is_loopback_name(name: str) -> bool:
    """localhost, a name under it (RFC 6761: it resolves to loopback, browsers do not ask DNS),
    or a loopback address."""
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True  # the common names without parsing an address (a few µs)
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_origin(request: web.Request) -> None:
    """Refuse a request a page of another site sent (a browser names the page's origin on
    every cross-origin request and on every POST): it could spend or reload on the local
    user's trust. Clients that are not browsers send no Origin; the proxy's own page, its
    origin, which is what its Host names."""
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is None or same_origin(origin, request.headers.get(hdrs.HOST)):
        return
    raise Forbidden(
        f"requests sent by another site's page are refused: Origin {origin[:200]!r} is not "
        "this proxy's own; call it from a program (which sends no Origin) or from its own /ui",
        code="foreign_origin",
    )


def same_origin(origin: str, host: str | None) -> bool:
    if host is None:
        return False
    try:
        url = URL(origin)
    except ValueError:
        return False
    if url.scheme not in ("http", "https") or url.host is None:
        return False  # "null" (a sandboxed frame, a file), or not a web origin
    name, port = split_host(host)
    if url.host.rstrip(".").lower() != name:
        return False
    # A Host without a port: the client called the default port of its scheme.
    return url.port == port if port is not None else url.is_default_port()


@dataclass(frozen=True, slots=True)
class KeyPlaces:
    """Where a client may present its key beyond `Authorization: Bearer`: the headers and
    query parameters its wire format names (each wire's `key_headers`, `key_query`, collected
    by the registry). A key in the query is never logged: the access log writes the path
    without its query."""

    headers: tuple[str, ...] = ()
    queries: tuple[str, ...] = ()


KEY_PLACES = web.AppKey("key_places", KeyPlaces)
BEARER_ONLY = KeyPlaces()  # an app that was handed no places (one built without the wires)


def presented_key(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    places = request.app.get(KEY_PLACES, BEARER_ONLY)
    for header in places.headers:
        if key := request.headers.get(header):
            return key
    for name in places.queries:
        if key := request.query.get(name):
            return key
    return None


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


def is_local(request: web.Request) -> bool:
    """Whether a request without a key is the local user's: from a loopback address, naming
    the proxy (HostNames). A loopback request naming another host is refused here: a page
    whose name now points at 127.0.0.1 must not get what the local user gets."""
    if not is_loopback(request):
        return False
    host = request.headers.get(hdrs.HOST)
    if request.app[HOST_NAMES].serves(host):
        return True
    raise Forbidden(
        f"this proxy is not served as {(host or '')[:200]!r} to a request without a key: "
        "only under its own names (localhost, a loopback address, server.host); add the name "
        "to server.allowed_hosts if it is this proxy's, or send a key",
        code="host_not_served",
    )


def authenticate(request: web.Request, keys: Keys) -> ApiKey | None:
    """The caller's ApiKey, None when the proxy is open (no keys, the local user), else 401."""
    if not keys.api_keys:
        if is_local(request):
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
        if is_local(request):
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
