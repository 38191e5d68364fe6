"""The audit: who did what on the admin surface, as one JSON line in the log (logger
`agentproxy.audit`) and one entry in the store (GET /admin/audit), kept under its retention.

An entry is `{"at", "action", "who", "from", ...details}`. It never holds a secret: the
callers hand names, teams, limits and the reasons of a refusal, never a key, a digest or what
a failed caller presented.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import orjson

from proxy.logs.limit import warn_limited
from proxy.policies.diff import config_diff
from proxy.policies.spec import Config
from proxy.policies.watch import ReloadOutcome
from proxy.store.admin_records import AdminRecords
from proxy.store.base import StoreError

log = logging.getLogger("agentproxy.audit")

Action = Literal[
    "key.create",
    "key.rotate",
    "key.revoke",
    "config.reload",
    "config.reload_refused",
    "admin.auth_failed",
]


class Audit:
    def __init__(self, records: AdminRecords, keep_s: Callable[[], float]) -> None:
        self.records = records
        self._keep_s = keep_s  # store.session_ttl_s: the store's retention
        self._writing: set[asyncio.Task[Any]] = set()

    async def record(
        self, action: Action, who: str, remote: str | None, **details: Any
    ) -> dict[str, Any]:
        """Logged at once, then stored (a store that fails is warned about, the action
        stands: the log line has it)."""
        entry = {"at": time.time(), "action": action, "who": who, "from": remote, **details}
        log.info("%s", orjson.dumps(entry).decode())
        try:
            await self.records.append_audit(entry, self._keep_s())
        except StoreError as exc:
            warn_limited(log, "audit.store", "audit entry %s not stored: %s", action, exc)
        return entry

    def soon(self, action: Action, who: str, remote: str | None, **details: Any) -> None:
        """`record` from code that cannot wait (a reload's listener)."""
        task = asyncio.ensure_future(self.record(action, who, remote, **details))
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)

    async def settled(self) -> None:
        """Every entry `soon` was given, stored (or its failure warned)."""
        if self._writing:
            await asyncio.gather(*self._writing, return_exceptions=True)

    def reloads(
        self,
        outcome: ReloadOutcome,
        before: Config,
        after: Config | None,
        actor: Mapping[str, str] | None,
    ) -> None:
        """A ConfigHolder's reload listener: `config.reload` with what changed, by name, or
        `config.reload_refused` with why. The file watcher and SIGHUP are named as who."""
        who = actor["who"] if actor else outcome.trigger
        remote = actor["from"] if actor else None
        if after is None:
            errors = [line[:1000] for line in outcome.errors[:20]]
            self.soon("config.reload_refused", who, remote, trigger=outcome.trigger, errors=errors)
            return
        self.soon(
            "config.reload",
            who,
            remote,
            trigger=outcome.trigger,
            version=outcome.version,
            previous_version=before.version,
            changes=config_diff(before, after),
        )
