"""Function declarations as the stages' chat tools, converted once per distinct tools list.

A client re-sends the same tools every turn (Gemini CLI: a dozen declarations, their schemas
several KB), and converting them walks every schema to lower Google's upper-case types: the
same work each turn, for the same result. So a conversion is remembered by a digest of the
raw `tools` value, as the JSON bytes of its chat tools; each turn loads its own objects from
them (a stage may change its request's tools in place: no turn ever holds another's).

Content-addressed, one memo for the process: its bytes are a pure function of the tools' own,
so what any tenant gets from it is what converting its own list gives, to the byte; that
another sent the list first changes nothing but how fast. The digest is xxh3-128 with a seed
of the process's: no client can craft a list that shares another's key. Bounded by the bytes it
holds (least recently used first).
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson
import xxhash
from cachetools import LRUCache

from proxy.wire.gemini.request import field as read

MAX_BYTES = 4 * 1024 * 1024
_SEED = secrets.randbits(64)  # per process: tools come from clients


class ConversionMemo:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._cache: LRUCache[int, bytes] = LRUCache(max(1, max_bytes), getsizeof=len)

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def bytes(self) -> int:
        return int(self._cache.currsize)

    def chat_tools(self, tools: Any, declarations: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """New chat tools for `declarations` (all those of `tools`, the body's raw value, in
        order): one for each, in the same order."""
        if not declarations:
            return []
        try:
            key = xxhash.xxh3_128_intdigest(orjson.dumps(tools), _SEED)
        except orjson.JSONEncodeError:  # nothing orjson read; converted, not remembered
            return [chat_tool(declaration) for declaration in declarations]
        found = self._cache.get(key)
        if found is None:
            found = orjson.dumps([chat_tool(declaration) for declaration in declarations])
            if len(found) <= self._cache.maxsize:
                self._cache[key] = found
        converted: list[dict[str, Any]] = orjson.loads(found)
        return converted


CONVERSIONS = ConversionMemo()


def chat_tool(declaration: dict[str, Any]) -> dict[str, Any]:
    """A function declaration as a chat tool."""
    function: dict[str, Any] = {"name": declaration.get("name")}
    if "description" in declaration:
        function["description"] = declaration["description"]
    parameters = read(declaration, "parametersJsonSchema") or declaration.get("parameters")
    if parameters is not None:
        function["parameters"] = _lower_types(parameters)
    return {"type": "function", "function": function}


def _lower_types(schema: Any) -> Any:
    """Google's OpenAPI schema as JSON Schema: its types are upper case (OBJECT, STRING)."""
    if isinstance(schema, dict):
        out = {k: _lower_types(v) for k, v in schema.items()}
        if isinstance(out.get("type"), str):
            out["type"] = out["type"].lower()
        return out
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema
