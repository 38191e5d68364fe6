"""Reading and checking an OpenAI Chat Completions request body.

Checks only what the proxy relies on or what would otherwise fail upstream with a vaguer error;
every other field passes through untouched.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import BadRequest
from proxy.json_values import kind
from proxy.wire.body import parse_json_object

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def parse_chat_request(raw: bytes) -> dict[str, Any]:
    body = parse_json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", param="model")
    _check_messages(body.get("messages"))
    _check_optional(body, "stream", bool)
    _check_optional(body, "stream_options", dict)
    _check_optional(body, "tools", list)
    for i, tool in enumerate(body.get("tools") or ()):
        if type(tool) is not dict or type(tool.get("type")) is not str:
            where = f"tools[{i}]"
            if not isinstance(tool, dict):
                raise BadRequest(f"{where} must be an object, not {kind(tool)}", param=where)
            raise BadRequest(
                f"{where}.type must be a string such as 'function', not {kind(tool.get('type'))}",
                param=f"{where}.type",
            )
    _check_stop(body.get("stop"))
    response_format = body.get("response_format")
    if response_format is not None and (
        type(response_format) is not dict or type(response_format.get("type")) is not str
    ):
        if not isinstance(response_format, dict):
            raise BadRequest(
                f"'response_format' must be an object, not {kind(response_format)}",
                param="response_format",
            )
        raise BadRequest(
            "'response_format.type' must be a string ('text', 'json_object' or 'json_schema'), "
            f"not {kind(response_format.get('type'))}",
            param="response_format.type",
        )
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(name)
        if value is not None and (type(value) is not int or value < 1):
            raise BadRequest(f"'{name}' must be a positive integer", param=name)
    return body


def _check_optional(body: dict[str, Any], name: str, expected: type) -> None:
    value = body.get(name)
    if value is not None and not isinstance(value, expected):
        raise BadRequest(f"'{name}' must be {_KIND_NAMES[expected]}, not {kind(value)}", param=name)


def _check_stop(stop: Any) -> None:
    if stop is None or type(stop) is str:
        return
    if not isinstance(stop, list):
        raise BadRequest(
            f"'stop' must be a string or an array of strings, not {kind(stop)}", param="stop"
        )
    for i, sequence in enumerate(stop):
        if not isinstance(sequence, str):
            raise BadRequest(
                f"'stop[{i}]' must be a string, not {kind(sequence)}", param=f"stop[{i}]"
            )


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", param="messages")
    for i, message in enumerate(messages):  # every turn re-sends them all: keep it lean
        if (
            type(message) is not dict
            or type(role := message.get("role")) is not str
            or role not in ROLES
            or (content_type := type(content := message.get("content"))) not in _CONTENT_TYPES
            or (content is None and role in _CONTENT_REQUIRED)
            or (content_type is list and not _parts_well_formed(content))
            or (role == "tool" and type(message.get("tool_call_id")) is not str)
            or type(message.get("tool_calls")) not in _CALLS_TYPES
        ):
            _refuse_message(i, message)


def _parts_well_formed(parts: Any) -> bool:
    for part in parts:  # noqa: SIM110 - a loop costs half what all() over a generator does
        if type(part) is not dict or type(part.get("type")) is not str:
            return False
    return True


_CONTENT_TYPES = frozenset({str, list, type(None)})  # JSON parsers give exactly these types
_CALLS_TYPES = frozenset({list, type(None)})
# Only an assistant's content may be absent (its tool calls say it all); a legacy `function`
# result's may be null too.
_CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})


def _refuse_message(i: int, message: Any) -> None:
    """Raise the error that says what is wrong with messages[i] (it is wrong somewhere)."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise BadRequest(f"{where} must be an object, not {kind(message)}", param=where)
    role = message.get("role")
    if type(role) is not str or role not in ROLES:  # an array or object is unhashable
        raise BadRequest(
            f"{where}.role must be one of {', '.join(sorted(ROLES))}, not {_shown(role)}",
            param=f"{where}.role",
        )
    content = message.get("content")
    if content is None and role in _CONTENT_REQUIRED:
        raise BadRequest(
            f"{where}.content is required for a '{role}' message: a string or an array of parts",
            param=f"{where}.content",
        )
    if content is not None and not isinstance(content, str | list):
        raise BadRequest(
            f"{where}.content must be a string, an array of parts or null, not {kind(content)}",
            param=f"{where}.content",
        )
    for j, part in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(part, dict):
            raise BadRequest(
                f"{where}.content[{j}] must be an object, not {kind(part)}",
                param=f"{where}.content[{j}]",
            )
        if not isinstance(part.get("type"), str):
            raise BadRequest(
                f"{where}.content[{j}].type must be a string such as 'text', "
                f"not {kind(part.get('type'))}",
                param=f"{where}.content[{j}].type",
            )
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise BadRequest(
            f"{where} has role 'tool' but no string 'tool_call_id'",
            param=f"{where}.tool_call_id",
        )
    tool_calls = message.get("tool_calls")
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise BadRequest(f"{where}.tool_calls must be an array", param=f"{where}.tool_calls")
    # A subclass of dict/str/list (not from a JSON parser) passed the checks above: accepted.


_KIND_NAMES: dict[type, str] = {bool: "a boolean", dict: "an object", list: "an array"}


def _shown(value: Any) -> str:
    """A value named in an error message: short strings quoted, anything else by its kind."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:40]) + "..."
    return kind(value)
