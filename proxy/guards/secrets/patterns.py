"""What a secret looks like: the built-in kinds and a policy's own patterns.

Python's regular expressions scan at ~10 ns a character per alternative, so a built-in kind
is not searched for across a text: each begins with one of a few literal markers (`AKIA`,
`ghp_`, `sk-`, `-----BEGIN `, `eyJ`, `KEY`…), found by substring search (C speed; a text
holding none of them, the common tool result, costs those searches and nothing else), and
the kind's compiled pattern is matched at each marker found. A policy's own patterns have no
marker: they are compiled into one alternation and searched across every text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from cachetools import LRUCache

WORD = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


@dataclass(frozen=True, slots=True)
class Kind:
    rule: str  # the metric's `rule` label
    markers: tuple[str, ...]  # a match begins with one of these
    pattern: re.Pattern[str]  # matched where a marker begins
    after_word: bool = False  # may it follow a word character (else a token of its own)
    group: str | None = None  # only this group of the match is the secret


def _kind(rule: str, markers: tuple[str, ...], pattern: str, **options: object) -> Kind:
    return Kind(rule, markers, re.compile(pattern), **options)  # type: ignore[arg-type]


BUILTIN = (
    _kind("aws_access_key", ("AKIA", "ASIA"), r"(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])"),
    _kind(
        "github_token",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        r"(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{22,251})",
    ),
    _kind("api_key", ("sk-",), r"sk-(?:ant-)?[A-Za-z0-9][A-Za-z0-9_-]{19,250}"),
    _kind(
        "private_key",
        ("-----BEGIN ",),
        r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----[\s\S]{1,16384}?-----END [A-Z ]{0,40}"
        r"PRIVATE KEY-----",
        after_word=True,
    ),
    _kind(
        "jwt",
        ("eyJ",),
        r"eyJ[A-Za-z0-9_-]{8,4096}\.eyJ[A-Za-z0-9_-]{8,8192}\.[A-Za-z0-9_-]{8,4096}",
    ),
    # NAME=value, NAME ending in one of these (upper case): only the value is the secret, a
    # value being a token's characters (not code: `KEY = os.environ["X"]`, `$(cat f)`).
    _kind(
        "env_value",
        ("KEY", "SECRET", "TOKEN", "PASSWORD"),
        r"(?:KEY|SECRET|TOKEN|PASSWORD)[ \t]*=[ \t]*[\"']?"
        r"(?P<env>[\w+/=.:@%~!^*&,;?|-][\w+/=.:@%~!^*&,;?|$#-]{3,1023})(?=[\s\"'`]|\Z)",
        after_word=True,
        group="env",
    ),
)


@dataclass(frozen=True, slots=True)
class Found:
    rule: str
    start: int
    end: int


class SecretPatterns:
    """The built-in kinds and `patterns` (compiled once per distinct pattern list)."""

    def __init__(self, patterns: tuple[str, ...] = ()) -> None:
        named = "|".join(f"(?P<pattern_{i}>{p})" for i, p in enumerate(patterns))
        self.custom = re.compile(named) if patterns else None

    def find(self, text: str) -> Iterator[Found]:
        """The secrets in `text`, in order, none overlapping."""
        found = [*self._builtin(text), *self._custom(text)]
        if not found:
            return
        found.sort(key=lambda f: (f.start, -f.end))
        at = 0
        for one in found:
            if one.start >= at:
                yield one
                at = one.end

    def _builtin(self, text: str) -> Iterator[Found]:
        for kind in BUILTIN:
            for marker in kind.markers:
                at = text.find(marker)
                while at >= 0:
                    if kind.after_word or at == 0 or text[at - 1] not in WORD:
                        match = kind.pattern.match(text, at)
                        if match is not None:
                            start, end = match.span(kind.group or 0)
                            yield Found(kind.rule, start, end)
                    at = text.find(marker, at + 1)

    def _custom(self, text: str) -> Iterator[Found]:
        if self.custom is None:
            return
        for match in self.custom.finditer(text):
            if match.end() > match.start():
                yield Found(match.lastgroup or "pattern", match.start(), match.end())


_compiled: LRUCache[tuple[str, ...], SecretPatterns] = LRUCache(64)


def patterns_for(extra: tuple[str, ...]) -> SecretPatterns:
    """The compiled patterns of a policy (shared by every policy with the same list)."""
    found = _compiled.get(extra)
    if found is None:
        found = _compiled[extra] = SecretPatterns(extra)
    return found
