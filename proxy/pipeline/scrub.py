"""The guard's secrets stage: every message's text, tool results and tool-call arguments
scanned for secrets and each replaced by its stable placeholder (proxy/guards/secrets/
scrubber.py); the session's map back to them goes on the exchange, for the answer to give
them back (proxy/guards/secrets/restore.py). What a secret is and how it is given back live
in proxy/guards/secrets/; this module is the chain's hook into it (first stage, incremental,
fail-closed), as every stage is.

Incremental: the messages the chain found unchanged since the session's last turn are taken
from that turn's output, and the secrets they held are still in the session's map; a turn
scans its new messages only, each with a few substring searches unless it may hold a secret.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from proxy.errors import InternalError
from proxy.exchange import Exchange
from proxy.guards.mode import STAGE, reported
from proxy.guards.secrets.patterns import patterns_for
from proxy.guards.secrets.placeholders import Minter
from proxy.guards.secrets.scrubber import Scrubber, alternation
from proxy.messages import Message
from proxy.pipeline.base import StageContext, forget_sessions, record, reusable
from proxy.policies.spec import Policy

log = logging.getLogger("agentproxy.guard")
NAME = STAGE  # its events are the guard's (guard.scrub, guard.would_scrub)
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
        scrubber = Scrubber(self.minter, owner, patterns, last.secrets, last.known)
        out = last.output[:reused]
        changed = last.changed if reused == last.length else _changed(out, messages)
        for message in messages[reused:]:
            scrubbed = scrubber.message(message)
            changed += scrubbed is not message
            out.append(scrubbed)
        known = last.known
        if len(scrubber.secrets) > held:  # learnt this turn: out of this turn's messages too
            known = alternation(scrubber.secrets.values())
            learnt = alternation(list(scrubber.secrets.values())[held:])
            if learnt is not None:
                again = Scrubber(self.minter, owner, patterns, scrubber.secrets, learnt, True)
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
        action = reported(ex, "scrub")  # would_scrub in a dry run (the guard's or the policy's)
        dry = action != "scrub"
        for rule, count in scrubber.found.items():
            ctx.metrics.child(ctx.metrics.guard, action, rule).inc(count)
        if secrets and not dry:
            ex.secrets = secrets
        if not changed:
            return None
        record(
            ex, ctx, NAME, action,
            messages=changed, found=sum(scrubber.found.values()), rules=sorted(scrubber.found),
        )  # fmt: skip
        return None if dry else out


def _changed(out: list[Message], messages: list[Message]) -> int:
    return sum(a is not b for a, b in zip(out, messages, strict=False))
