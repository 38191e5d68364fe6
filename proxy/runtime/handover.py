"""A recycled worker's guard state, shared with the worker that replaces it.

With the embedded store, loop levels, budget counters, lineage tips and open circuits live in
the worker's memory (MemoryState). A worker replaced for its memory (`server.max_rss_mb`, or
SIGUSR1) stops accepting and, in one step, writes that state to a file in the store's
directory and starts a journal of every change it makes from then on; then its parent forks
the successor, which restores the file (deleting it), journals its own changes and serves at
once, while the old worker finishes its requests. Until the old worker has exited, each reads
the other's journal before any read or write of its state: both serve, and budgets and loop
ladders stay exact. The successor deletes both journals once the old worker is gone.

The journals are kept by a wrapper around the state (HandoverState) that the app puts in place
only in a worker that a parent replaces (`Handover.around`): the state itself knows nothing of
them.

Files are named after the parent (`handover-<parent>.json`, `handover-<parent>-<worker>.jsonl`):
only a sibling reads them, and the parent removes what is left when it exits. Redis-kept state
is shared already and needs no hand-over.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from aiohttp import web

from proxy.store.state import MemoryState, StateStore

log = logging.getLogger("agentproxy")

CHECK_PEERS_S = 0.5  # how often a worker looks for a peer's journal, or whether it is gone


def handover_path(store_dir: str | os.PathLike[str], parent: int | None = None) -> Path:
    """Where a worker of `parent` (by default this process's parent) leaves its state."""
    return Path(store_dir) / f"handover-{os.getppid() if parent is None else parent}.json"


def journal_path(store_dir: str | os.PathLike[str], worker: int) -> Path:
    """Where `worker`, a child of this process's parent, journals its changes."""
    return Path(store_dir) / f"handover-{os.getppid()}-{worker}.jsonl"


def discard(store_dir: str | os.PathLike[str]) -> None:
    """The parent, exiting: what its workers left and no successor took (the stop came during
    a hand-over) goes with it, rather than lie in the store's directory."""
    for left in Path(store_dir).glob(f"handover-{os.getpid()}[.-]*"):
        left.unlink(missing_ok=True)


def save(state: MemoryState, path: Path) -> int:
    """Write `state` for the successor (atomically, readable by this user only); the number
    of entries written."""
    saved = {"from": os.getpid(), **state.export()}
    partial = path.with_suffix(".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(orjson.dumps(saved))
    partial.replace(path)
    return len(saved["values"]) + len(saved["counters"])


def take(state: MemoryState, path: Path) -> tuple[int, int | None]:
    """Restore what a predecessor saved at `path`, if anything, and delete it: the number of
    entries restored and the predecessor's pid. A file that cannot be read is logged and
    dropped: the worker then starts as a fresh process would, with no guard state."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return 0, None
    except OSError as exc:
        log.error("could not read the previous worker's guard state (%s): starting without it", exc)
        return 0, None
    try:
        path.unlink()
        saved = orjson.loads(raw)
        predecessor = saved.get("from")
        return state.restore(saved), predecessor if isinstance(predecessor, int) else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.error("the previous worker's guard state in %s is unreadable (%s): starting without "
                  "it", path, exc)  # fmt: skip
        return 0, None


class HandoverState:
    """A worker's in-memory state while it may share it with another (a StateStore around a
    MemoryState). While journals are kept, `changed` hears every change made here (to write
    it to this worker's journal) and `catch_up` applies the other worker's before any read or
    write; otherwise both are None and every call is passed on as it is."""

    backend = "memory"

    def __init__(self, inner: MemoryState) -> None:
        self.inner = inner
        self.changed: Callable[[list[Any]], None] | None = None
        self.catch_up: Callable[[], None] | None = None

    async def get(self, space: str, key: str) -> bytes | None:
        if self.catch_up is not None:
            self.catch_up()
        return await self.inner.get(space, key)

    async def set(self, space: str, key: str, value: bytes, ttl_s: float | None = None) -> None:
        if self.catch_up is not None:
            self.catch_up()
        await self.inner.set(space, key, value, ttl_s)
        if self.changed is not None:  # built only while it is heard
            self.changed(["set", space, key, base64.b64encode(value).decode(), ttl_s])

    async def delete(self, space: str, key: str) -> None:
        if self.catch_up is not None:
            self.catch_up()
        await self.inner.delete(space, key)
        if self.changed is not None:
            self.changed(["delete", space, key])

    async def counters(self, space: str, key: str) -> dict[str, float]:
        if self.catch_up is not None:
            self.catch_up()
        return await self.inner.counters(space, key)

    async def add(
        self,
        space: str,
        key: str,
        amounts: Mapping[str, float],
        *,
        first: Mapping[str, float] | None = None,
        ttl_s: float | None = None,
    ) -> dict[str, float]:
        if self.catch_up is not None:
            self.catch_up()
        values = await self.inner.add(space, key, amounts, first=first, ttl_s=ttl_s)
        if self.changed is not None:
            self.changed(["add", space, key, dict(amounts), dict(first or {}), ttl_s])
        return values

    async def publish(self, space: str, field: str, value: float, ttl_s: float) -> None:
        if self.catch_up is not None:
            self.catch_up()
        await self.inner.publish(space, field, value, ttl_s)
        if self.changed is not None:
            self.changed(["publish", space, field, value, ttl_s])

    async def published(self, space: str) -> dict[str, float]:
        if self.catch_up is not None:
            self.catch_up()
        return await self.inner.published(space)

    async def close(self) -> None:
        await self.inner.close()

    def apply(self, change: list[Any]) -> None:
        """Make a change another worker's HandoverState reported through `changed` (counters
        are added, so both workers' additions count); not reported again."""
        match change:
            case ["set", str(space), str(key), str(value), ttl_s]:
                self.inner.set_now(space, key, base64.b64decode(value), ttl_s)
            case ["delete", str(space), str(key)]:
                self.inner.delete_now(space, key)
            case ["add", str(space), str(key), dict(amounts), dict(first), ttl_s]:
                self.inner.add_now(space, key, amounts, first, ttl_s)
            case ["publish", str(space), str(field), value, ttl_s]:
                self.inner.publish_now(space, field, value, ttl_s)
            case _:
                raise ValueError(f"not a state change: {change!r:.200}")


@dataclass(slots=True)
class _Peer:
    """Another worker's journal, read as it grows."""

    pid: int
    path: Path
    journal: BinaryIO
    partial: bytes = b""  # a line not yet written whole

    def read(self, state: HandoverState) -> None:
        data = self.partial + self.journal.read()
        lines = data.split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            try:
                state.apply(orjson.loads(line))
            except (ValueError, TypeError) as exc:  # a change this worker cannot make: skip it
                log.error("worker %d's state journal: %s", self.pid, exc)


class Handover:
    """This worker's side of a hand-over (proxy/runtime/workers.py forks the successor)."""

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled  # a parent replaces this worker
        self.due = False  # this worker is leaving for a successor
        self._state: HandoverState | None = None
        self._directory: Path | None = None
        self._journal: BinaryIO | None = None
        self._peers: dict[int, _Peer] = {}
        self._checked = 0.0

    def around(self, state: StateStore) -> StateStore:
        """The state this worker serves with: in-memory state wrapped so that it can be shared
        with a predecessor or successor when a parent replaces this worker; any other as it
        is (state kept in Redis is shared already)."""
        if not self.enabled or not isinstance(state, MemoryState):
            return state
        self._state = HandoverState(state)
        return self._state

    @property
    def installed(self) -> bool:
        """Whether this worker's state goes to its successor (`around` wrapped it)."""
        return self._state is not None

    def attach(self, directory: str | os.PathLike[str]) -> int:
        """At start, once `around` wrapped the state: if a predecessor left its state in
        `directory`, take it and follow the predecessor's journal until it exits. The number
        of entries taken."""
        assert self._state is not None, "attach() follows around()"
        self._directory = Path(directory)
        taken, predecessor = take(self._state.inner, handover_path(directory))
        if predecessor is not None and _alive(predecessor):
            try:
                self._start_journal()
                self._follow(predecessor)
            except OSError as exc:
                log.error("cannot share guard state with the previous worker while it finishes "
                          "(%s): changes either makes from now on stay its own", exc)  # fmt: skip
                self.close()
        return taken

    def leave(self) -> int:
        """Hand over now (this worker has stopped accepting): the state to the file and the
        journal started in one step, so no change is in both or neither. The number of
        entries left; 0 when there is no state to hand over."""
        self.due = True
        if self._state is None or self._directory is None:
            return 0
        try:
            self._start_journal()
            return save(self._state.inner, handover_path(self._directory))
        except OSError as exc:
            log.error("could not leave the guard state for the next worker (%s): it starts "
                      "without it", exc)  # fmt: skip
            self.close()
            return 0

    async def tend(self) -> None:
        """Keep checking while journals are kept, even when no request touches the state."""
        while True:
            await asyncio.sleep(CHECK_PEERS_S)
            self.check()

    def check(self) -> None:
        """Apply what peers have journalled; every CHECK_PEERS_S, find a successor's journal
        and drop the peers that have exited. Called before every state access while
        journals are kept, and periodically (an idle worker still tidies up)."""
        if self._journal is None or self._state is None:
            return
        try:
            self._check(self._state)
        except OSError as exc:  # the requests go on, each worker with its own state
            log.error("stopped sharing guard state with the other worker (%s)", exc)
            self.close()

    def _check(self, state: HandoverState) -> None:
        if (now := time.monotonic()) - self._checked >= CHECK_PEERS_S:
            self._checked = now
            self._look_around(state)
        for peer in self._peers.values():
            peer.read(state)

    def _look_around(self, state: HandoverState) -> None:
        """Follow a successor's journal once it appears; drop the peers that have exited."""
        assert self._directory is not None
        # A leaving worker looks for its successor's journal. (A successor follows only the
        # predecessor it took over from: the one before that, if a second recycle came within
        # one drain, is in the snapshot it took, and reading its journal again would count it
        # twice; what that one changes afterwards is lost to it.)
        for path in self._directory.glob(f"handover-{os.getppid()}-*.jsonl") if self.due else ():
            named = path.stem.rsplit("-", 1)[1]
            pid = int(named) if named.isdecimal() else os.getpid()  # not a worker's: skipped
            if pid != os.getpid() and pid not in self._peers and _alive(pid):
                self._follow(pid)
        for peer in [p for p in self._peers.values() if not _alive(p.pid)]:
            peer.read(state)  # its last changes, written before it exited
            peer.journal.close()
            peer.path.unlink(missing_ok=True)
            del self._peers[peer.pid]
        if not self._peers and not self.due:  # the predecessor is gone: back to one worker
            self.close()
            journal_path(self._directory, os.getpid()).unlink(missing_ok=True)

    def close(self) -> None:
        """Stop journalling and following (a leaving worker's journal stays for the
        successor to read to its end)."""
        if self._state is not None:
            self._state.changed = self._state.catch_up = None
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        for peer in self._peers.values():
            peer.journal.close()
        self._peers.clear()

    def _start_journal(self) -> None:
        assert self._state is not None and self._directory is not None
        if self._journal is not None:
            return
        path = journal_path(self._directory, os.getpid())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        journal = self._journal = os.fdopen(fd, "ab", buffering=0)

        def changed(change: list[Any]) -> None:  # one write a change: a peer sees it at once
            journal.write(orjson.dumps(change) + b"\n")

        self._state.changed = changed
        self._state.catch_up = self.check

    def _follow(self, pid: int) -> None:
        assert self._directory is not None
        path = journal_path(self._directory, pid)
        try:
            journal = open(path, "rb", buffering=0)  # noqa: SIM115 (kept open while following)
        except FileNotFoundError:
            return
        self._peers[pid] = _Peer(pid, path, journal)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# The app's Handover (made in its setup; `serve`'s server reads it to hand its state over).
HANDOVER = web.AppKey("handover", Handover)
