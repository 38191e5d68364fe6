"""A recycled worker's guard state, handed to the worker that replaces it.

With the embedded store, loop levels, budget counters, lineage tips and open circuits live in
the worker's memory (MemoryState). A worker replaced for its memory (`server.max_rss_mb`, or
SIGUSR1) first drains, then writes that state to a file in the store's directory; its
successor, forked by the same parent, reads it back and deletes it before it serves, so every
budget and ladder goes on exactly where it was. The file is named after the parent: only a
sibling takes it. Redis-kept state is shared already and needs no hand-over.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from proxy.store.state import MemoryState

log = logging.getLogger("agentproxy")


@dataclass(slots=True)
class Handover:
    enabled: bool = False  # a parent replaces this worker (proxy/workers.py)
    due: bool = False  # this worker is leaving for a successor: save its state at clean-up


def handover_path(store_dir: str | os.PathLike[str], parent: int | None = None) -> Path:
    """Where a worker of `parent` (by default this process's parent) leaves its state."""
    return Path(store_dir) / f"handover-{os.getppid() if parent is None else parent}.json"


def discard(store_dir: str | os.PathLike[str]) -> None:
    """The parent, exiting: a state left by a worker that no successor took (the stop came
    during its hand-over) goes with it, rather than lie in the store's directory."""
    handover_path(store_dir, parent=os.getpid()).unlink(missing_ok=True)


def save(state: MemoryState, path: Path) -> int:
    """Write `state` for the successor (atomically, readable by this user only); the number
    of entries written."""
    saved = state.export()
    partial = path.with_suffix(".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(orjson.dumps(saved))
    partial.replace(path)
    return len(saved["values"]) + len(saved["counters"])


def take(state: MemoryState, path: Path) -> int:
    """Restore what a predecessor saved at `path`, if anything, and delete it; the number of
    entries restored. A file that cannot be read is logged and dropped: the worker then starts
    as a fresh process would, with no guard state."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log.error("could not read the previous worker's guard state (%s): starting without it", exc)
        return 0
    try:
        path.unlink()
        return state.restore(orjson.loads(raw))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.error("the previous worker's guard state in %s is unreadable (%s): starting without "
                  "it", path, exc)  # fmt: skip
        return 0
