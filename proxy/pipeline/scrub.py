"""Secrets out of what goes upstream: every message's text, tool results and tool-call
arguments scanned for secrets (proxy/guard/secret_patterns.py), each replaced by its stable
placeholder (proxy/guard/placeholders.py); the session's map back to them goes on the
exchange, for the answer to give them back (proxy/guard/restore.py).

Incremental: the messages the chain found unchanged since the session's last turn are taken
from that turn's output, and the secrets they held are still in the session's map; a turn
scans its new messages only, each with a few substring searches unless it may hold a secret.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from proxy.errors import InternalError
from proxy.exchange import Exchange
from proxy.guard.placeholders import Minter
from proxy.guard.secret_patterns import SecretPatterns, patterns_for
from proxy.messages import Message
from proxy.pipeline.base import StageContext, forget_sessions, record, reusable
from proxy.policies.spec import Policy

log = logging.getLogger("agentproxy.guard")
NAME = "guard"
KNOWN = "known"  # the rule of a secret found because the session already held it
# A secret shorter than this is replaced where a rule finds it, not wherever it stands.
MIN_KNOWN_CHARS = 8
SECRET_BYTES = 64  # what one entry of a session's map costs besides its secret


@dataclass(slots=True)
class _Session:
    secrets: dict[str, str]  # placeholder -> secret: never recorded, never logged
    size: int  # the request bytes its memo stands for, and its secrets'
    length: int  # how many input messages `output` covers
    output: list[Message]
    changed: int  # how many of them were scrubbed
    patterns: tuple[str, ...]
    basis: object | None  # the turn it was computed on (ex.rewrite.turn)
    known: re.Pattern[str] | None = None  # its secrets as one alternation


class _Scrubber:
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


class ScrubStage:
    name = NAME
    guard = True  # a history kept at the provider still sends its new messages through it
    preserves_pairing = True  # only contents and arguments change, never roles or ids

    def __init__(self, memo_bytes: int = 8 * 1024 * 1024, minter: Minter | None = None) -> None:
        self.minter = minter or Minter()
        self._sessions: LRUCache[str, _Session] = LRUCache(memo_bytes, getsizeof=lambda s: s.size)

    def memos(self) -> dict[str, LRUCache[Any, Any]]:
        return {"guard_secrets": self._sessions}

    def forget(self, sessions: set[str]) -> None:
        forget_sessions(sessions, named=[self._sessions])

    def enabled(self, policy: Policy) -> bool:
        return policy.guard.secrets.scrub

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        """Fails closed: a request its scan could not clear is not sent (the chain would
        forward a crashed stage's input, secrets and all)."""
        try:
            return self._scrub(ex, messages, ctx)
        except Exception as exc:
            log.error(  # its type only: the message could quote what was being scanned
                "guard: the secrets scan failed on request %s (%s); not sent",
                ex.identity.request_id, type(exc).__name__,
            )  # fmt: skip
            record(ex, ctx, NAME, "failed", error=type(exc).__name__)
            failed = InternalError(
                "the proxy could not check this request for secrets, so it was not sent",
                code="guard_failed",
            )
            failed.unsent = True
            raise failed from None

    def _scrub(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        spec = ex.policy.guard.secrets
        session = ex.identity.session
        last = self._sessions.pop(session, None)
        if last is None or last.patterns != spec.patterns:
            last = _Session({}, 0, 0, [], 0, spec.patterns, None)
        reused = last.length if last.length <= reusable(ex, messages, last.basis) else 0
        owner, patterns = ex.identity.owner, patterns_for(spec.patterns)
        held = len(last.secrets)
        scrubber = _Scrubber(self.minter, owner, patterns, last.secrets, last.known)
        out = last.output[:reused]
        changed = last.changed if reused == last.length else _changed(out, messages)
        for message in messages[reused:]:
            scrubbed = scrubber.message(message)
            changed += scrubbed is not message
            out.append(scrubbed)
        known = last.known
        if len(scrubber.secrets) > held:  # learnt this turn: out of this turn's messages too
            known = _alternation(scrubber.secrets.values())
            learnt = _alternation(list(scrubber.secrets.values())[held:])
            if learnt is not None:
                again = _Scrubber(self.minter, owner, patterns, scrubber.secrets, learnt, True)
                for index in range(reused, len(out)):
                    swept = again.message(out[index])
                    changed += swept is not out[index] and out[index] is messages[index]
                    out[index] = swept
        secrets = scrubber.secrets
        size = (ex.client.body_bytes or 64 * len(messages)) + sum(
            len(s) + SECRET_BYTES for s in secrets.values()
        )
        if messages is ex.messages and size <= self._sessions.maxsize:
            self._sessions[session] = _Session(
                secrets, size, len(messages), out, changed, spec.patterns, ex.rewrite.turn, known
            )
        dry = ex.dry_run
        for rule, count in scrubber.found.items():
            ctx.metrics.child(ctx.metrics.guard, "would_scrub" if dry else "scrub", rule).inc(count)
        if secrets and not dry:
            ex.secrets = secrets
        if not changed:
            return None
        record(
            ex, ctx, NAME, "would_scrub" if dry else "scrub",
            messages=changed, new=sum(scrubber.found.values()), rules=sorted(scrubber.found),
        )  # fmt: skip
        return None if dry else out


def _changed(out: list[Message], messages: list[Message]) -> int:
    return sum(a is not b for a, b in zip(out, messages, strict=False))


def _alternation(secrets: Any) -> re.Pattern[str] | None:
    """The secrets long enough to be found wherever they stand, as one pattern (longest
    first, so that one holding another is replaced whole)."""
    long = sorted({s for s in secrets if len(s) >= MIN_KNOWN_CHARS}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, long))) if long else None
