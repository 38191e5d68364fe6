"""Reading and checking an OpenAI Chat Completions request body.

Checks only what the proxy relies on or what would otherwise fail upstream with a vaguer error;
every other field passes through untouched.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.errors import BadRequest, PayloadTooLarge

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


async def read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(request.content_length, limit)
    body = bytearray()
    while chunk := await request.content.readany():
        body += chunk
        if len(body) > limit:
            raise _too_large(len(body), limit)
    return bytes(body)


def _too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body is {size} bytes or more, over the limit of {limit} bytes "
        "(server.max_body_bytes)"
    )


def parse_chat_request(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise BadRequest("request body is empty; send a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(_json_problem(raw, exc)) from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, not {_kind(body)}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", param="model")
    _check_messages(body.get("messages"))
    _check_optional(body, "stream", bool)
    _check_optional(body, "stream_options", dict)
    _check_optional(body, "tools", list)
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(name)
        if value is not None and (type(value) is not int or value < 1):
            raise BadRequest(f"'{name}' must be a positive integer", param=name)
    return body


def _json_problem(raw: bytes, exc: orjson.JSONDecodeError) -> str:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"request body is not valid UTF-8 (byte {bad.start}); send UTF-8 encoded JSON"
    return f"request body is not valid JSON: {exc}"


def _check_optional(body: dict[str, Any], name: str, kind: type) -> None:
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise BadRequest(f"'{name}' must be {_KIND_NAMES[kind]}, not {_kind(value)}", param=name)


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", param="messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{where} must be an object, not {_kind(message)}", param=where)
        role = message.get("role")
        if role not in ROLES:
            raise BadRequest(
                f"{where}.role must be one of {', '.join(sorted(ROLES))}, not {role!r}",
                param=f"{where}.role",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise BadRequest(
                f"{where}.content must be a string, an array of parts or null, "
                f"not {_kind(content)}",
                param=f"{where}.content",
            )
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise BadRequest(
                f"{where} has role 'tool' but no string 'tool_call_id'",
                param=f"{where}.tool_call_id",
            )
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise BadRequest(f"{where}.tool_calls must be an array", param=f"{where}.tool_calls")


_KIND_NAMES: dict[type, str] = {bool: "a boolean", dict: "an object", list: "an array"}


def _kind(value: Any) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)
