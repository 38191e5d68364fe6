"""One turn's scan of messages for secrets: each secret found (proxy/guards/secrets/
patterns.py, or one the session already holds) replaced by its stable placeholder
(placeholders.py) and put in the session's map back to the secrets. The stage that runs it
on each turn's new messages is proxy/pipeline/scrub.py."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from proxy.guards.secrets.patterns import SecretPatterns
from proxy.guards.secrets.placeholders import Minter
from proxy.messages import Message

KNOWN = "known"  # the rule of a secret found because the session already held it
# A secret shorter than this is replaced where a rule finds it, not wherever it stands.
MIN_KNOWN_CHARS = 8


class Scrubber:
    """One turn's scan: the secrets it finds go to the session's map."""

    def __init__(
        self,
        minter: Minter,
        owner: str,
        patterns: SecretPatterns,
        secrets: dict[str, str],
        known: re.Pattern[str] | None,
        literal_only: bool = False,
    ) -> None:
        self.minter = minter
        self.owner = owner
        self.patterns = patterns
        self.secrets = secrets
        self.known = known  # the secrets the session held already, found wherever they stand
        self.literal_only = literal_only
        self.found: Counter[str] = Counter()

    def text(self, text: str) -> str:
        spans = []
        if not self.literal_only:
            spans = [(f.start, f.end, f.rule) for f in self.patterns.find(text)]
        known = self.known
        if known is not None and known.search(text):  # a secret the session already holds
            spans += [(m.start(), m.end(), KNOWN) for m in known.finditer(text)]
            spans.sort(key=lambda span: (span[0], -span[1]))
        if not spans:
            return text
        pieces: list[str] = []
        at = 0
        for start, end, rule in spans:
            if start < at:
                continue  # inside one already replaced
            secret = text[start:end]
            placeholder = self.minter.placeholder(self.owner, secret)
            self.secrets[placeholder] = secret
            self.found[rule] += 1
            pieces += (text[at:start], placeholder)
            at = end
        pieces.append(text[at:])
        return "".join(pieces)

    def value(self, value: Any) -> Any:
        """A message's content (text, or parts holding text), scrubbed; the same object when
        nothing in it was a secret."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            out = [self.value(item) for item in value]
            return value if all(a is b for a, b in zip(out, value, strict=True)) else out
        if isinstance(value, dict):
            changed = {k: v2 for k, v in value.items() if (v2 := self._field(k, v)) is not v}
            return {**value, **changed} if changed else value
        return value

    def _field(self, key: str, value: Any) -> Any:
        # Text and nested contents (a tool result's blocks); not ids, signatures, images.
        return self.value(value) if key in ("text", "content") else value

    def message(self, message: Message) -> Message:
        changed: dict[str, Any] = {}
        content = message.get("content")
        scrubbed = self.value(content)
        if scrubbed is not content:
            changed["content"] = scrubbed
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            new_calls = [self._call(call) for call in calls]
            if any(a is not b for a, b in zip(new_calls, calls, strict=True)):
                changed["tool_calls"] = new_calls
        return {**message, **changed} if changed else message

    def _call(self, call: Any) -> Any:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return call
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            return call
        scrubbed = self.text(arguments)
        if scrubbed is arguments:
            return call
        return {**call, "function": {**function, "arguments": scrubbed}}


def alternation(secrets: Any) -> re.Pattern[str] | None:
    """The secrets long enough to be found wherever they stand, as one pattern (longest
    first, so that one holding another is replaced whole)."""
    long = sorted({s for s in secrets if len(s) >= MIN_KNOWN_CHARS}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, long))) if long else None
