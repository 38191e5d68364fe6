"""A port that cannot be listened on is one line, not the bind's traceback: which address,
why (taken, privileged, not this machine's) and how to pick another."""

from __future__ import annotations

import errno

from aiohttp import web

WHY = {
    errno.EADDRINUSE: "is in use (by another process, or an agentproxy already running)",
    errno.EACCES: "is not ours to listen on (ports below 1024 need privileges)",
    errno.EADDRNOTAVAIL: "is not an address of this machine",
}


class ListenError(OSError):
    """The bind failed; str() is the line to show. An OSError still, so callers that catch
    OSError (a start-up that says "cannot start") keep doing so."""

    def __init__(self, host: str, port: int, error: OSError, choose: str) -> None:
        why = WHY.get(error.errno or 0, f"cannot be listened on ({error.strerror or error})")
        shown = f"[{host}]" if ":" in host else host
        super().__init__(error.errno, f"{shown}:{port} {why}; {choose}")

    def __str__(self) -> str:
        return str(self.strerror)


async def start_site(site: web.TCPSite, host: str, port: int, choose: str) -> None:
    """Start listening; a failed bind raises ListenError saying `choose`, how to pick another
    port (e.g. "give another with --port N")."""
    try:
        await site.start()
    except OSError as exc:
        raise ListenError(host, port, exc, choose) from exc
