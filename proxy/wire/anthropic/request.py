"""Reading and checking an Anthropic Messages request body.

Checks what the proxy relies on (the view maps messages and blocks by role, type and ids) and
what Anthropic would refuse anyway, with the same field paths in the message; every other
field passes through untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.errors import BadRequest
from proxy.json_values import kind
from proxy.wire.body import parse_json_object

ROLES = ("user", "assistant", "system")  # "system": Claude Code's mid-conversation beta
MID_CONVERSATION_BETA = "mid-conversation-tool-changes-2026-07-01"  # the one Claude Code sends


def parse_messages_request(raw: bytes, *, counting: bool = False) -> dict[str, Any]:
    """`counting`: a count_tokens request, which has no max_tokens."""
    body = parse_json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: Field required (a non-empty string)", param="model")
    max_tokens = body.get("max_tokens")
    if counting and max_tokens is None:
        pass
    elif type(max_tokens) is not int or max_tokens < 1:
        raise BadRequest("max_tokens: Field required (a positive integer)", param="max_tokens")
    _check_messages(body.get("messages"))
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        _check_blocks(system, "system")
    for name, expected in (("stream", bool), ("tools", list), ("tool_choice", dict)):
        value = body.get(name)
        if value is not None and not isinstance(value, expected):
            raise BadRequest(f"{name}: must be {_NAMES[expected]}, not {kind(value)}", param=name)
    for index, tool in enumerate(body.get("tools") or []):
        if not isinstance(tool, dict):
            raise BadRequest(f"tools.{index}: must be an object, not {kind(tool)}")
    return body


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: at least one message is required", param="messages")
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise BadRequest(f"{where}: must be an object, not {kind(message)}", param=where)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise BadRequest(
                f"{where}.role: Input should be 'user' or 'assistant'", param=f"{where}.role"
            )
        content = message.get("content")
        if not isinstance(content, str):
            _check_blocks(content, f"{where}.content")


def _check_blocks(blocks: Any, where: str) -> None:
    if not isinstance(blocks, list):
        raise BadRequest(f"{where}: must be a string or an array of blocks, not {kind(blocks)}")
    for k, block in enumerate(blocks):
        at = f"{where}.{k}"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise BadRequest(f"{at}: must be a content block with a string 'type'", param=at)
        kind_ = block["type"]
        if kind_ == "tool_use" and not (
            isinstance(block.get("id"), str) and isinstance(block.get("name"), str)
        ):
            raise BadRequest(f"{at}: a tool_use block needs a string 'id' and 'name'", param=at)
        if kind_ == "tool_result" and not isinstance(block.get("tool_use_id"), str):
            raise BadRequest(f"{at}: a tool_result block needs a string 'tool_use_id'", param=at)
        if kind_ == "text" and not isinstance(block.get("text"), str):
            raise BadRequest(f"{at}.text: must be a string", param=f"{at}.text")


_NAMES: dict[type, str] = {bool: "a boolean", dict: "an object", list: "an array"}


def implied_headers(request: Mapping[str, Any]) -> dict[str, str]:
    """For a request recorded without its headers: the beta its `role: "system"` messages
    show it came with (the API refuses the role without one)."""
    messages = request.get("messages")
    if isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") == "system" for m in messages
    ):
        return {"anthropic-beta": MID_CONVERSATION_BETA}
    return {}
