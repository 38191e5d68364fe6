"""Reading and parsing a request body, for every wire format: bounded in size, in silence and
in nesting, with a clear 4xx for each."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from proxy.errors import BadRequest, PayloadTooLarge, RequestTimeout
from proxy.http.body_budget import BODY_BUDGET
from proxy.json_values import MAX_JSON_DEPTH, kind, nested_too_deep


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, at most `limit` bytes; 408 once the client is silent for `timeout_s`.

    What has already arrived is taken without a timer (a small body is usually all there when
    the handler runs, and arming a timer costs ~6 us); only a wait for more is timed.

    The body's bytes are reserved from server.max_body_bytes_in_flight first (503 when it is
    spent): all of a `Content-Length` at once, a chunked body chunk by chunk."""
    length = request.content_length
    budget = request.app[BODY_BUDGET]
    if length is not None:
        if length > limit:
            raise _too_large(length, limit)
        if length:
            budget.reserve(request, length)
    content = request.content
    chunks: list[bytes] = []  # joined once at the end: one copy of the body, not two
    size = 0
    while True:
        chunk = content.read_nowait()
        if not chunk:
            if content.at_eof():
                break
            try:
                async with asyncio.timeout(timeout_s):
                    chunk = await content.readany()
            except TimeoutError:
                raise RequestTimeout(
                    f"the request body stopped arriving: nothing for {timeout_s:g} s after "
                    f"{size} bytes (server.body_timeout_s)"
                ) from None
            if not chunk:
                break
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        if length is None:
            budget.reserve(request, len(chunk))
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body is {size} bytes or more, over the limit of {limit} bytes "
        "(server.max_body_bytes)"
    )


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise BadRequest("request body is empty; send a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(_json_problem(raw, exc)) from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, not {kind(body)}")
    if nested_too_deep(raw, body):
        raise BadRequest(
            f"request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep"
        )
    return body


def _json_problem(raw: bytes, exc: orjson.JSONDecodeError) -> str:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"request body is not valid UTF-8 (byte {bad.start}); send UTF-8 encoded JSON"
    if "depth" in str(exc):
        return f"request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep"
    return f"request body is not valid JSON: {exc}"
