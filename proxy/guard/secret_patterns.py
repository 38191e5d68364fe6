"""What a secret looks like: the built-in kinds and a policy's own patterns, as one compiled
alternation (one pass over a text), behind a cheap check that a text cannot hold one."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from cachetools import LRUCache

# Each kind's name is its metric's `rule` label; the policy's patterns are `pattern_<n>`.
BUILTIN = {
    "aws_access_key": r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    "github_token": r"\b(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{22,251})",
    "api_key": r"\bsk-(?:ant-)?[A-Za-z0-9][A-Za-z0-9_-]{19,250}",
    "private_key": (
        r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----[\s\S]{1,16384}?-----END [A-Z ]{0,40}"
        r"PRIVATE KEY-----"
    ),
    "jwt": r"\beyJ[A-Za-z0-9_-]{8,4096}\.eyJ[A-Za-z0-9_-]{8,8192}\.[A-Za-z0-9_-]{8,4096}",
    # NAME=value: only the value is the secret (the env group). A placeholder is no value.
    "env_value": (
        r"\b[A-Z0-9_]*(?:KEY|SECRET|TOKEN|PASSWORD)[ \t]*=[ \t]*[\"']?"
        r"(?P<env>[^\s\"'`«»]{4,1024})"
    ),
}
# At least one of these is in every text a built-in kind matches: a text with none of them
# (the common tool result) costs a few substring searches, no regular expression.
MARKERS = (
    "AKIA", "ASIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "sk-",
    "PRIVATE KEY-----", "eyJ", "KEY", "SECRET", "TOKEN", "PASSWORD",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Found:
    rule: str
    start: int
    end: int


class SecretPatterns:
    """The built-in kinds and `patterns`, compiled once per distinct pattern list."""

    def __init__(self, patterns: tuple[str, ...] = ()) -> None:
        named = dict(BUILTIN)
        named.update({f"pattern_{i}": p for i, p in enumerate(patterns)})
        self.rules = tuple(named)
        self.custom = bool(patterns)  # no marker says a custom pattern cannot match
        self.regex = re.compile("|".join(f"(?P<{n}>{p})" for n, p in named.items()))

    def may_hold(self, text: str) -> bool:
        return self.custom or any(marker in text for marker in MARKERS)

    def find(self, text: str) -> Iterator[Found]:
        """The secrets in `text`, in order, none overlapping."""
        if not self.may_hold(text):
            return
        for match in self.regex.finditer(text):
            rule = match.lastgroup or ""
            if rule == "env_value":
                start, end = match.span("env")
            else:
                start, end = match.span()
            if end > start:
                yield Found(rule, start, end)


_compiled: LRUCache[tuple[str, ...], SecretPatterns] = LRUCache(64)


def patterns_for(extra: tuple[str, ...]) -> SecretPatterns:
    """The compiled patterns of a policy (shared by every policy with the same list)."""
    found = _compiled.get(extra)
    if found is None:
        found = _compiled[extra] = SecretPatterns(extra)
    return found
