"""Figures on their way to the index of sessions (proxy/store/listing.py), off the requests'
path: merged by session as they come, written in one store call a moment later (`linger_s`),
kept for the next try when the store fails. At most `sessions` sessions wait; figures of
another past them are left out (said, rate-limited). Used by the recording's writer (turns not
recorded) and by the shared board (calls of sessions no policy records)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from proxy.logs.limit import warn_limited
from proxy.store.listing import Listed

Write = Callable[[list[Listed]], Awaitable[None]]


class ListingBatch:
    def __init__(
        self, write: Write, log: logging.Logger, what: str, sessions: int, linger_s: float
    ) -> None:
        self._write = write
        self._log = log
        self._what = what  # the rate-limited warnings' key and wording
        self._sessions = sessions
        self._linger_s = linger_s
        self._pending: dict[str, Listed] = {}  # by scoped session: not written yet
        self._writing: asyncio.Task[None] | None = None

    def add(self, entry: Listed) -> None:
        if not self._merge(entry):
            warn_limited(self._log, f"{self._what}.full", "%s: %d sessions wait for the "
                         "store; figures of another are not listed", self._what,
                         self._sessions)  # fmt: skip
            return
        if self._writing is None or self._writing.done():
            self._writing = asyncio.get_running_loop().create_task(self._written())

    async def flush(self) -> None:
        """Wait until the figures added so far are written (or failed)."""
        if self._writing is not None and not self._writing.done():
            await asyncio.shield(self._writing)

    async def close(self, wait_s: float = 5.0) -> None:
        if self._writing is not None and not self._writing.done():
            try:
                await asyncio.wait_for(self.flush(), wait_s)
            except TimeoutError:
                self._writing.cancel()

    def _merge(self, entry: Listed) -> bool:
        waiting = self._pending.get(entry.session)
        if waiting is not None:
            waiting.add(entry)
        elif len(self._pending) < self._sessions:
            self._pending[entry.session] = entry
        else:
            return False
        return True

    async def _written(self) -> None:
        await asyncio.sleep(self._linger_s)  # for more to come
        entries, self._pending = list(self._pending.values()), {}
        try:
            await self._write(entries)
        except Exception as exc:
            for entry in entries:
                self._merge(entry)
            warn_limited(self._log, self._what, "%s: the store's index of sessions was not "
                         "written: %s: %s", self._what, type(exc).__name__, exc)  # fmt: skip
