"""What a recording may not keep: the keys the proxy knows of (the client's, the deployments'
api keys and extra_headers values) and whatever the policy's `record.redact` patterns match,
each replaced by "[redacted]" in every string of a recorded structure, its objects' keys
included, before any of it reaches the store."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import LRUCache

REDACTED = "[redacted]"
# Secrets shorter than this are not searched for: "a" would redact every "a".
MIN_SECRET_CHARS = 8


@dataclass(frozen=True, slots=True)
class Redaction:
    """How one turn is redacted: `pattern` (the secrets, taken literally, and the policy's
    patterns, as one alternation) replaced in every string of a structure."""

    pattern: re.Pattern[str] | None
    literals: tuple[bytes, ...]  # the secrets as they appear in JSON text
    # Every structure walked: the policy has patterns (a match in a string may not be one
    # in its JSON text), or a secret holds a character JSON escapes.
    always: bool

    def json(self, value: Any, raw: bytes) -> bytes:
        """`raw` (orjson's bytes of `value`) redacted: the same bytes when nothing is to be,
        found by a scan of the bytes for the secrets when that is enough (no patterns)."""
        if self.pattern is None:
            return raw
        if not self.always and not any(literal in raw for literal in self.literals):
            return raw
        clean = scrub(value, self.pattern)
        return raw if clean is value else orjson.dumps(clean)

    def value(self, value: Any) -> Any:
        return scrub(value, self.pattern)


NOTHING = Redaction(None, (), False)
# One per (patterns, secrets) pair: requests of one key and policy share it.
_compiled: LRUCache[tuple[re.Pattern[str] | None, tuple[str, ...]], Redaction] = LRUCache(256)


def matcher(pattern: re.Pattern[str] | None, secrets: tuple[str, ...]) -> Redaction:
    """The policy's patterns and the secrets (taken literally) as one Redaction."""
    given = (pattern, secrets)
    found = _compiled.get(given)  # every turn of one key and policy: looked up as it comes
    if found is None:
        found = _compiled[given] = _compile(pattern, secrets)
    return found


def _compile(pattern: re.Pattern[str] | None, secrets: tuple[str, ...]) -> Redaction:
    secrets = tuple(sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len))[::-1]
    parts = [re.escape(secret) for secret in secrets]
    if pattern is not None:
        parts.append(pattern.pattern)
    if not parts:
        return NOTHING
    literals = tuple(orjson.dumps(secret)[1:-1] for secret in secrets)
    escaped = any(lit != s.encode() for lit, s in zip(literals, secrets, strict=True))
    joined = re.compile("|".join(f"(?:{part})" for part in parts))
    return Redaction(joined, literals, pattern is not None or escaped)


def scrub(value: Any, redact: re.Pattern[str] | None) -> Any:
    """`value` (parsed JSON) with every match of `redact` in its strings replaced; the same
    object when nothing matched (no copy made)."""
    if redact is None:
        return value
    if isinstance(value, str):
        return redact.sub(REDACTED, value) if redact.search(value) else value
    if isinstance(value, dict):
        pairs: list[tuple[Any, Any]] | None = None  # as far as read, once something changed
        for at, (name, item) in enumerate(value.items()):
            clean = scrub(item, redact)
            key = scrub(name, redact) if isinstance(name, str) else name  # keys hold text too
            if pairs is None and (clean is not item or key is not name):
                pairs = list(value.items())[:at]
            if pairs is not None:
                pairs.append((key, clean))
        return value if pairs is None else _keyed(pairs)
    if isinstance(value, list):
        changed: list[Any] | None = None
        for index, item in enumerate(value):
            clean = scrub(item, redact)
            if clean is not item:
                changed = changed if changed is not None else list(value)
                changed[index] = clean
        return value if changed is None else changed
    return value


def _keyed(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """The pairs as an object, in order; keys redacted alike kept apart ("[redacted] (2)")."""
    out: dict[Any, Any] = {}
    for key, item in pairs:
        name, n = key, 1
        while name in out:
            n += 1
            name = f"{key} ({n})"
        out[name] = item
    return out
