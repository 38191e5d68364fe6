"""The floor a Python proxy stands on: a bare aiohttp forwarder, for bench/overhead.py to
hold the proxy against.

Run as its own process: `python bench/_bare_forwarder.py --upstream http://127.0.0.1:N`.
It prints `listening <port>` once bound. Every POST is parsed with orjson (as any proxy that
reads the body must), posted to the same path upstream over one pooled ClientSession, and
answered with the upstream's status and bytes: whole, or relayed chunk by chunk when the
upstream streams. No policies, no auth, no limits: what aiohttp itself costs.
"""

from __future__ import annotations

import argparse
import socket
import sys

import orjson
from aiohttp import ClientSession, TCPConnector, web

PASSED = ("authorization", "x-api-key", "x-goog-api-key", "anthropic-version", "content-type")


def app(upstream: str) -> web.Application:
    application = web.Application()
    session: ClientSession | None = None

    async def start(_: web.Application) -> None:
        nonlocal session
        session = ClientSession(connector=TCPConnector(limit=0))

    async def stop(_: web.Application) -> None:
        if session is not None:
            await session.close()

    async def forward(request: web.Request) -> web.StreamResponse:
        assert session is not None
        body = orjson.loads(await request.read())
        headers = {k: v for k, v in request.headers.items() if k.lower() in PASSED}
        url = upstream + request.path
        async with session.post(url, data=orjson.dumps(body), headers=headers) as answer:
            kind = answer.headers.get("content-type", "application/json")
            if not kind.startswith("text/event-stream"):
                data = await answer.read()
                return web.Response(body=data, status=answer.status, headers={"content-type": kind})
            response = web.StreamResponse(status=answer.status)
            response.content_type = "text/event-stream"
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    application.on_startup.append(start)
    application.on_cleanup.append(stop)
    application.router.add_post("/{path:.*}", forward)
    return application


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9000")
    parser.add_argument("--uvloop", action="store_true", help="on uvloop's event loop")
    args = parser.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"listening {sock.getsockname()[1]}", flush=True)
    loop = None
    if args.uvloop:
        import uvloop

        loop = uvloop.new_event_loop()
    application = app(args.upstream.rstrip("/"))
    web.run_app(application, sock=sock, print=None, access_log=None, loop=loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
