"""What the proxy checks of JSON values wherever they come from: how deep they may nest (a
check cheap enough for every request), and how a value's kind is named in error messages.

orjson parses 1,024 levels but serializes only 254, and Python code that walks or compares a
value recurses once per level; a body is serialized again on its way out (sometimes inside an
envelope). Real requests nest ~10 deep (tool schemas), so 128 leaves room on both sides.
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_JSON_DEPTH = 128
_ORJSON_DUMPS_DEPTH = 254  # orjson.dumps refuses deeper values (tests pin it)
# Under this size counting '[' and '{' is cheaper than the serializing check, and bounds depth.
_COUNT_BELOW = 8 * 1024


class _Value:
    """Stands for the checked value at the bottom of _ENVELOPE: orjson asks `default` for it."""

    __slots__ = ()


_ENVELOPE: object = _Value()
for _ in range(_ORJSON_DUMPS_DEPTH - MAX_JSON_DEPTH):
    _ENVELOPE = (_ENVELOPE,)


def nested_too_deep(text: bytes | str, value: Any) -> bool:
    """True when `value`, parsed from `text`, nests arrays and objects deeper than
    MAX_JSON_DEPTH.

    No Python walk of every node: a small text's count of '[' and '{' bounds its depth; a
    larger value is serialized inside 254 - MAX_JSON_DEPTH levels of envelope, which orjson
    refuses exactly when the whole is deeper than its 254. Measured: 9 us for a 30 KB agent
    turn and 25 us for a 77 KB body with 24 tool schemas, where a recursive walk takes 7 and
    160 us; under 1 us for a small body.
    """
    if len(text) < _COUNT_BELOW:
        if isinstance(text, bytes):
            opening = text.count(b"[") + text.count(b"{")
        else:
            opening = text.count("[") + text.count("{")
        if opening <= MAX_JSON_DEPTH:
            return False
    try:
        orjson.dumps(_ENVELOPE, default=lambda _: value)
    except orjson.JSONEncodeError:
        return True
    return False


def kind(value: Any) -> str:
    """How a JSON value is named in messages: 'an object', 'an array', 'a string'..."""
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)
