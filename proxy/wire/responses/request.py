"""Reading and checking an OpenAI Responses request body.

Checks what the proxy relies on (the view maps items by type, role and call_id); every other
field and item passes through untouched.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import BadRequest
from proxy.json_values import kind
from proxy.wire.body import parse_json_object

ROLES = ("user", "assistant", "system", "developer")
CALL_ITEMS = (
    "function_call",
    "custom_tool_call",
    "function_call_output",
    "custom_tool_call_output",
)


def parse_responses_request(raw: bytes) -> dict[str, Any]:
    body = parse_json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", param="model")
    given = body.get("input")
    if isinstance(given, list):
        for index, item in enumerate(given):
            _check_item(item, f"input[{index}]")
    elif not isinstance(given, str):
        raise BadRequest(
            f"'input' must be a string or an array of items, not {kind(given)}", param="input"
        )
    for name, expected in (("stream", bool), ("tools", list), ("instructions", str)):
        value = body.get(name)
        if value is not None and not isinstance(value, expected):
            raise BadRequest(f"'{name}' must be {_NAMES[expected]}, not {kind(value)}", param=name)
    for index, tool in enumerate(body.get("tools") or []):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise BadRequest(f"tools[{index}] must be an object with a string 'type'")
    limit = body.get("max_output_tokens")
    if limit is not None and (type(limit) is not int or limit < 1):
        raise BadRequest(
            "'max_output_tokens' must be a positive integer", param="max_output_tokens"
        )
    return body


def _check_item(item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise BadRequest(f"{where} must be an object, not {kind(item)}", param=where)
    kind_ = item.get("type", "message")
    if not isinstance(kind_, str):
        raise BadRequest(f"{where}.type must be a string", param=f"{where}.type")
    if kind_ == "message":
        if item.get("role") not in ROLES:
            raise BadRequest(
                f"{where}.role must be one of {', '.join(ROLES)}", param=f"{where}.role"
            )
        content = item.get("content")
        if not isinstance(content, str | list):
            raise BadRequest(
                f"{where}.content must be a string or an array of parts, not {kind(content)}",
                param=f"{where}.content",
            )
        if isinstance(content, list) and not all(isinstance(p, dict) for p in content):
            raise BadRequest(f"{where}.content parts must be objects", param=f"{where}.content")
    elif kind_ in CALL_ITEMS and not isinstance(item.get("call_id"), str):
        raise BadRequest(f"{where}.call_id must be a string", param=f"{where}.call_id")
    if kind_ == "function_call" and not (
        isinstance(item.get("name"), str) and isinstance(item.get("arguments"), str)
    ):
        raise BadRequest(
            f"{where}: a function_call needs a string 'name' and 'arguments'", param=where
        )
    if kind_ == "computer_call_output":  # its output is one screenshot object
        if not isinstance(item.get("output"), dict):
            raise BadRequest(
                f"{where}.output must be a computer_screenshot object", param=f"{where}.output"
            )
    elif kind_ == "apply_patch_call_output":  # its output is an optional log text
        if not isinstance(item.get("output"), str | None):
            raise BadRequest(f"{where}.output must be a string", param=f"{where}.output")
    elif kind_.endswith("_call_output") and not _is_output(item.get("output")):
        raise BadRequest(
            f"{where}.output must be a string or an array of parts", param=f"{where}.output"
        )


def _is_output(output: Any) -> bool:
    return isinstance(output, str) or (
        isinstance(output, list) and all(isinstance(p, dict) for p in output)
    )


_NAMES: dict[type, str] = {bool: "a boolean", list: "an array", str: "a string"}
