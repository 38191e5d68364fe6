"""What a recording may not keep: the keys the proxy knows of (the client's, the deployment's)
and whatever the policy's `record.redact` patterns match, each replaced by "[redacted]" in
every string of a recorded structure, before any of it reaches the store."""

from __future__ import annotations

import re
from typing import Any

from cachetools import LRUCache

REDACTED = "[redacted]"
# Secrets shorter than this are not searched for: "a" would redact every "a".
MIN_SECRET_CHARS = 8

# One alternation per (patterns, secrets) pair: requests of one key and policy share it.
_compiled: LRUCache[tuple[re.Pattern[str] | None, tuple[str, ...]], re.Pattern[str] | None] = (
    LRUCache(256)
)


def matcher(pattern: re.Pattern[str] | None, secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """The policy's patterns and the secrets (taken literally) as one regular expression."""
    secrets = tuple(sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len))[::-1]
    key = (pattern, secrets)
    if key in _compiled:
        return _compiled[key]
    parts = [re.escape(secret) for secret in secrets]
    if pattern is not None:
        parts.append(pattern.pattern)
    joined = re.compile("|".join(f"(?:{part})" for part in parts)) if parts else None
    _compiled[key] = joined
    return joined


def scrub(value: Any, redact: re.Pattern[str] | None) -> Any:
    """`value` (parsed JSON) with every match of `redact` in its strings replaced; the same
    object when nothing matched (no copy made)."""
    if redact is None:
        return value
    if isinstance(value, str):
        return redact.sub(REDACTED, value) if redact.search(value) else value
    if isinstance(value, dict):
        out: dict[str, Any] | None = None
        for name, item in value.items():
            clean = scrub(item, redact)
            if clean is not item:
                out = out if out is not None else dict(value)
                out[name] = clean
        return value if out is None else out
    if isinstance(value, list):
        changed: list[Any] | None = None
        for index, item in enumerate(value):
            clean = scrub(item, redact)
            if clean is not item:
                changed = changed if changed is not None else list(value)
                changed[index] = clean
        return value if changed is None else changed
    return value
