"""The append-only JSONL event log: one line per rewrite or decision, with its references.

Written off the event loop: a request only queues its line; one writer thread appends lines
in batches and rotates the file by size (`events.jsonl` → `.1` → … → `.keep`, the oldest
dropped), through the standard library's QueueListener and RotatingFileHandler. A line is
never split across files and never lost while the queue has room; when it has none (a disk
slower than the traffic for long), the line is counted as dropped and said in the log.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from proxy.logs.limit import warn_limited
from proxy.store.files import private_dir, private_file

if TYPE_CHECKING:
    from proxy.exchange import Exchange

log = logging.getLogger("agentproxy.events")
MB = 1024 * 1024
QUEUED_LINES = 100_000  # lines waiting for the writer thread, at most


class _Lines(logging.handlers.RotatingFileHandler):
    """Each record is one preformatted JSON line; a write error is said, never raised."""

    def format(self, record: logging.LogRecord) -> str:
        return str(record.msg)

    def _open(self) -> Any:  # each new file (after a rotation too) its user's alone
        private_file(self.baseFilename)
        return super()._open()

    def handleError(self, record: logging.LogRecord) -> None:
        warn_limited(log, "events.write", "event log %s not writable; a line was lost",
                     self.baseFilename)  # fmt: skip


class EventLog:
    def __init__(self, path: str | None, max_mb: float = 100, keep: int = 5) -> None:
        self.path = path
        self.max_bytes = int(max_mb * MB)
        self.keep = keep
        self.dropped = 0
        self._queue: queue.Queue[logging.LogRecord] = queue.Queue(QUEUED_LINES)
        self._listener: logging.handlers.QueueListener | None = None

    def write(self, ex: Exchange, stage: str, action: str, fields: dict[str, Any]) -> None:
        if self.path is None:
            return
        line = {
            "at": round(time.time(), 3),
            "request_id": ex.identity.request_id,
            "session": ex.identity.session_name,
            "owner": ex.identity.owner,
            "policy": ex.policy.name,
            "model": ex.alias,
            "dry_run": ex.dry_run,
            "stage": stage,
            "action": action,
            **fields,
        }
        if self._listener is None and not self._start():
            return
        text = orjson.dumps(line, default=str).decode()
        record = logging.LogRecord("agentproxy.events", logging.INFO, "", 0, text, None, None)
        try:
            self._queue.put_nowait(record)
        except queue.Full:  # the log must never hold up a request
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.warning("event log %s falls behind: %d lines dropped", self.path, self.dropped)

    def _start(self) -> bool:
        assert self.path is not None
        try:
            private_dir(Path(self.path).parent)
            handler = _Lines(self.path, maxBytes=self.max_bytes, backupCount=self.keep)
        except OSError as exc:  # the log must never fail a request
            warn_limited(log, "events.open", "event log %s not writable: %s", self.path, exc)
            return False
        handler.terminator = "\n"
        self._listener = logging.handlers.QueueListener(self._queue, handler)
        self._listener.start()
        return True

    def flush(self) -> None:
        """Wait until every line queued so far is written (tests, shutdown)."""
        if self._listener is not None:
            self._listener.stop()  # drains the queue, then ends the thread
            self._listener.start()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.stop()
            for handler in self._listener.handlers:
                handler.close()
            self._listener = None
