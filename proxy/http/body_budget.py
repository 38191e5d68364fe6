"""The bytes of request bodies that the requests being handled hold, all together.

`server.max_in_flight` bounds how many requests are handled at once, but each may hold up to
`server.max_body_bytes`: 1,000 x 32 MiB. This budget bounds their sum. A request reserves its
`Content-Length` before its body is read (a chunked body reserves as it arrives) and gives it
back when it ends, however it ends (the middleware); past the budget a request is refused
with 503 and Retry-After, its body not read.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from proxy.errors import Overloaded

RETRY_AFTER_S = 1
# What the request holds of the budget; the middleware gives it back when the request ends.
BODY_HELD = web.RequestKey("body_held", int)


class BodyBudget:
    __slots__ = ("_limit", "held")

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit  # read per reservation: the setting reloads
        self.held = 0

    def reserve(self, request: web.Request, size: int) -> None:
        limit = self._limit()
        if self.held + size > limit:
            raise Overloaded(
                f"request bodies being handled hold {self.held} bytes; {size} more would pass "
                f"the proxy's limit of {limit} (server.max_body_bytes_in_flight); retry shortly",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self.held += size
        request[BODY_HELD] = request.get(BODY_HELD, 0) + size

    def release(self, request: web.Request) -> None:
        size = request.get(BODY_HELD, 0)
        if size:
            request[BODY_HELD] = 0
            self.held -= size


BODY_BUDGET = web.AppKey("body_budget", BodyBudget)
