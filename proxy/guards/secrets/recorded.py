"""What a recording keeps of a request whose secrets the guard scrubbed: the client's body
with each secret replaced by its placeholder, as the provider saw it (the recording's own
redaction, record.redact, is another thing, applied after)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def with_placeholders(value: Any, secrets: Mapping[str, str] | None) -> Any:
    """`value` (parsed JSON) with every secret of `secrets` (by placeholder) in its strings
    replaced by its placeholder; the same object when none is in it."""
    if not secrets:
        return value
    by_secret = {secret: placeholder for placeholder, secret in secrets.items()}
    pattern = re.compile("|".join(re.escape(s) for s in sorted(by_secret, key=len, reverse=True)))
    return _walk(value, pattern, by_secret)


def _walk(value: Any, pattern: re.Pattern[str], by_secret: dict[str, str]) -> Any:
    if isinstance(value, str):
        if not pattern.search(value):
            return value
        return pattern.sub(lambda m: by_secret[m.group(0)], value)
    if isinstance(value, list):
        out = [_walk(item, pattern, by_secret) for item in value]
        return value if all(a is b for a, b in zip(out, value, strict=True)) else out
    if isinstance(value, dict):
        changed = {k: w for k, v in value.items() if (w := _walk(v, pattern, by_secret)) is not v}
        return {**value, **changed} if changed else value
    return value
