"""The append-only JSONL event log: one line per rewrite or decision, with its references."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from proxy.exchange import Exchange

log = logging.getLogger("agentproxy.events")


class EventLog:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self._file: IO[bytes] | None = None

    def write(self, ex: Exchange, stage: str, action: str, fields: dict[str, Any]) -> None:
        if self.path is None:
            return
        line = {
            "at": round(time.time(), 3),
            "request_id": ex.request_id,
            "session": ex.session_name,
            "owner": ex.owner,
            "policy": ex.policy.name,
            "model": ex.alias,
            "dry_run": ex.dry_run,
            "stage": stage,
            "action": action,
            **fields,
        }
        try:
            if self._file is None:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "ab")  # noqa: SIM115 - kept open for appends
            self._file.write(orjson.dumps(line, default=str) + b"\n")
            self._file.flush()
        except OSError as exc:  # the log must never fail a request
            log.warning("event log %s not writable: %s", self.path, exc)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
