"""Mutated requests for fuzzing a route: hypothesis strategies over any valid seed body.

A `Case` is a seed body plus mutations, drawn by hypothesis (so a failure shrinks to a small,
readable case): values at random paths swapped for odd types or out-of-range numbers, keys
dropped or added, lists (messages, tool calls, parts) cut, duplicated or reordered, values nested
100-5,000 deep (as JSON and as JSON text inside a string), and the encoded bytes truncated or
spliced with random ones. Nothing here knows a wire format: a route is fuzzed by giving its
path, valid seed bodies and the parameter names it checks (`FuzzTarget`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from hypothesis import strategies as st

JSON = Any


def openai_error_body(body: JSON) -> bool:
    """{"error": {"message": str, "type": str, ...}}: OpenAI's shape (and Anthropic's error
    object has the same two fields)."""
    error = body.get("error") if isinstance(body, dict) else None
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str)
    )


@dataclass(frozen=True)
class FuzzTarget:
    """What to fuzz: a route, valid bodies to mutate, the top-level parameters it knows, the
    headers every request carries, and what an error body looks like in its wire format."""

    route: str
    seeds: tuple[dict[str, JSON], ...]
    params: tuple[str, ...]
    headers: dict[str, str] = field(default_factory=dict)
    is_error_body: Callable[[JSON], bool] = openai_error_body


# --- mutations ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replace:
    """The value at a path (any depth) becomes `value`."""

    path: int
    value: JSON

    def apply(self, body: JSON, nests: list[bytes]) -> JSON:
        return _at(body, self.path, lambda _old: self.value)


@dataclass(frozen=True)
class Delete:
    path: int

    def apply(self, body: JSON, nests: list[bytes]) -> JSON:
        slots = _slots(body)
        if slots:
            parent, key = slots[self.path % len(slots)]
            del parent[key]
        return body


@dataclass(frozen=True)
class Insert:
    """A new key in some object (or a new item in some array)."""

    path: int
    key: str
    value: JSON

    def apply(self, body: JSON, nests: list[bytes]) -> JSON:
        containers = [body, *(c for c in _values(body) if isinstance(c, dict | list))]
        target = containers[self.path % len(containers)]
        if isinstance(target, dict):
            target[self.key] = self.value
        elif isinstance(target, list):
            target.insert(self.path % (len(target) + 1), self.value)
        # else: an earlier mutation replaced the whole body by a scalar: nothing to insert into
        return body


@dataclass(frozen=True)
class Shuffle:
    """List surgery: messages, tool calls or content parts out of order, missing or repeated."""

    path: int
    how: str  # drop | duplicate | reverse | rotate | clear | swap
    index: int

    def apply(self, body: JSON, nests: list[bytes]) -> JSON:
        lists = [c for c in [body, *_values(body)] if isinstance(c, list) and c]
        if not lists:
            return body
        items = lists[self.path % len(lists)]
        i = self.index % len(items)
        if self.how == "drop":
            del items[i]
        elif self.how == "duplicate":
            items.insert(i, copy.deepcopy(items[i]))
        elif self.how == "reverse":
            items.reverse()
        elif self.how == "rotate":
            items[:] = items[i:] + items[:i]
        elif self.how == "clear":
            items.clear()
        else:
            items[0], items[i] = items[i], items[0]
        return body


@dataclass(frozen=True)
class Param:
    """A known top-level parameter set to an out-of-range or odd value."""

    name: str
    value: JSON

    def apply(self, body: JSON, nests: list[bytes]) -> JSON:
        if isinstance(body, dict):
            body[self.name] = self.value
        return body


@dataclass(frozen=True)
class Nest:
    """The value at a path wrapped `depth` levels deep, in arrays or objects, as JSON or as JSON
    text inside a string (tool-call arguments are parsed by the proxy)."""

    path: int
    depth: int
    shape: str  # array | object | text

    def apply(self, body: JSON, nests: list[bytes]) -> JSON:
        if self.shape == "object":
            deep = b'{"a":' * self.depth + b"1" + b"}" * self.depth
        else:
            deep = b"[" * self.depth + b"]" * self.depth
        if self.shape == "text":
            deep = orjson.dumps(deep.decode())
        marker = f"\x00nest{len(nests)}\x00"
        nests.append(deep)
        return _at(body, self.path, lambda _old: marker)


@dataclass(frozen=True)
class Truncate:
    at: int

    def apply_bytes(self, raw: bytes) -> bytes:
        return raw[: self.at % (len(raw) + 1)]


@dataclass(frozen=True)
class Splice:
    """Random bytes (invalid UTF-8 and stray quotes and brackets included) over or into the
    encoded body."""

    at: int
    data: bytes
    overwrite: bool

    def apply_bytes(self, raw: bytes) -> bytes:
        i = self.at % (len(raw) + 1)
        end = i + len(self.data) if self.overwrite else i
        return raw[:i] + self.data + raw[end:]


TreeOp = Replace | Delete | Insert | Shuffle | Param | Nest
ByteOp = Truncate | Splice


@dataclass(frozen=True)
class Case:
    seed: int
    tree_ops: tuple[TreeOp, ...]
    byte_ops: tuple[ByteOp, ...]

    def body(self, target: FuzzTarget) -> bytes:
        """The request body this case sends: the same bytes every time."""
        body = copy.deepcopy(target.seeds[self.seed % len(target.seeds)])
        nests: list[bytes] = []
        for op in self.tree_ops:
            body = op.apply(body, nests)
        # json, not orjson: integers past 64 bits must go out as written.
        raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        for i, deep in enumerate(nests):
            raw = raw.replace(orjson.dumps(f"\x00nest{i}\x00"), deep, 1)
        for byte_op in self.byte_ops:
            raw = byte_op.apply_bytes(raw)
        return raw


def _values(value: JSON) -> list[JSON]:
    """Every value below `value`, depth first."""
    found: list[JSON] = []
    stack = [value]
    while stack:
        current = stack.pop()
        children = current.values() if isinstance(current, dict) else current
        if isinstance(current, dict | list):
            for child in children:
                found.append(child)
                stack.append(child)
    return found


def _slots(value: JSON) -> list[tuple[Any, Any]]:
    """(container, key) for every value below `value`."""
    slots: list[tuple[Any, Any]] = []
    for container in [value, *_values(value)]:
        if isinstance(container, dict):
            slots.extend((container, key) for key in container)
        elif isinstance(container, list):
            slots.extend((container, i) for i in range(len(container)))
    return slots


def _at(body: JSON, path: int, change: Any) -> JSON:
    slots = _slots(body)
    if not slots:
        return change(body)
    parent, key = slots[path % len(slots)]
    parent[key] = change(parent[key])
    return body


# --- strategies --------------------------------------------------------------------------------

_WEIRD_TEXT = [
    "", " ", "\x00", "\u202e", "\ufeff", "😀" * 3, "null", "[]", "{}", "true", "<|im_end|>",
    "data: [DONE]\n\n", "\r\n\r\n", "system", "tool", "function", "x" * 5000, "é" * 300,
]  # fmt: skip
_NUMBERS = [
    0, -1, 1, 2, -(2**31), 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, 10**30, -(10**30),
    0.5, -0.0, 1e-300, 1.7e308, -1.7e308, 3.14,
]  # fmt: skip

odd_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(_NUMBERS),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(_WEIRD_TEXT),
    st.text(max_size=20),
)
odd_values: st.SearchStrategy[JSON] = st.recursive(
    odd_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def tree_ops(target: FuzzTarget) -> st.SearchStrategy[TreeOp]:
    paths = st.integers(0, 10_000)
    return st.one_of(
        st.builds(Replace, paths, odd_values),
        st.builds(Delete, paths),
        st.builds(Insert, paths, st.sampled_from(["role", "content", "x", "", *target.params]),
                  odd_values),
        st.builds(Shuffle, paths,
                  st.sampled_from(["drop", "duplicate", "reverse", "rotate", "clear", "swap"]),
                  st.integers(0, 100)),
        st.builds(Param, st.sampled_from(target.params), odd_values),
        st.builds(Nest, paths, st.integers(100, 5_000),
                  st.sampled_from(["array", "object", "text"])),
    )  # fmt: skip


byte_ops: st.SearchStrategy[ByteOp] = st.one_of(
    st.builds(Truncate, st.integers(0, 100_000)),
    st.builds(
        Splice,
        st.integers(0, 100_000),
        st.one_of(st.binary(min_size=1, max_size=8), st.sampled_from([b'"', b"]", b"}", b"\xff"])),
        st.booleans(),
    ),
)


def cases(target: FuzzTarget) -> st.SearchStrategy[Case]:
    """Mostly well-formed JSON with odd content (it reaches deeper code); a quarter of the
    cases also have their bytes broken."""
    broken = st.sampled_from([False, False, False, True]).flatmap(
        lambda yes: st.lists(byte_ops, min_size=1, max_size=2) if yes else st.just([])
    )
    return st.builds(
        Case,
        st.integers(0, len(target.seeds) - 1),
        st.lists(tree_ops(target), min_size=1, max_size=4).map(tuple),
        broken.map(tuple),
    )
