"""The session inspector at /ui: one HTML page, one script, one stylesheet (proxy/ui/), no build
step and nothing loaded from elsewhere (the Content-Security-Policy forbids it).

The page holds no data: it reads GET /admin/sessions and the archive route with the key the
person types (kept in the tab's sessionStorage, sent as a Bearer token), and those routes decide
what that key sees. The page itself is served to anyone when the proxy has keys (a visitor
without one sees a key field and nothing else), else to its local user only (a loopback client
naming the proxy). It tells the script whether a key is needed (always, once the proxy has any
key), so a visitor is asked for one before any request is refused.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Final

from aiohttp import web

from proxy.errors import Unauthorized
from proxy.http.auth import is_local
from proxy.policies.spec import Keys
from proxy.state import CONFIG

routes = web.RouteTableDef()

# Only what the page's own origin serves: scripts, styles, images, fetches; no inline script,
# no frames, no forms posting elsewhere, no <base> rewriting the page's links.
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
# The files under /ui/, by name, with their content types: nothing else is served.
ASSETS: Final = {
    "inspector.js": "text/javascript",
    "inspector.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
KEY_MARK: Final = b'data-key=""'  # where the page says whether a key is needed


@cache  # a handful of small files, read once
def _read(name: str) -> bytes:
    return files("proxy").joinpath("ui", name).read_bytes()


@routes.get("/ui")
async def page(request: web.Request) -> web.Response:
    keys = request.app[CONFIG].current.keys
    _admit(request, keys)
    # Admitted without a key only when the proxy has none at all: then nothing asks for one.
    needed = b"optional" if not keys.api_keys and keys.admin_digest is None else b"required"
    body = _read("index.html").replace(KEY_MARK, b'data-key="' + needed + b'"', 1)
    return web.Response(body=body, content_type="text/html", charset="utf-8", headers=HEADERS)


@routes.get("/ui/")
async def page_slash(request: web.Request) -> web.Response:
    raise web.HTTPFound("/ui")


@routes.get("/ui/{name}")
async def asset(request: web.Request) -> web.Response:
    _admit(request, request.app[CONFIG].current.keys)
    name = request.match_info["name"]
    kind = ASSETS.get(name)
    if kind is None:
        raise web.HTTPNotFound()
    charset = None if kind.startswith("image/") else "utf-8"
    return web.Response(body=_read(name), content_type=kind, charset=charset, headers=HEADERS)


def _admit(request: web.Request, keys: Keys) -> None:
    """Anyone when the proxy has a key that could let them see anything, else its local user
    (a loopback client naming the proxy: proxy/http/auth.py)."""
    if keys.api_keys or keys.admin_digest is not None or is_local(request):
        return
    raise Unauthorized(
        "no keys are configured, so the inspector serves loopback clients only; "
        "set keys.admin_key (or keys.api_keys)"
    )
