"""`agentproxy serve --workers N`: N processes serving one port.

The parent binds the port once and forks the workers; each runs its own event loop and
application on the shared listening socket (the kernel hands each new connection to one of
them). Signals go to the parent, which passes SIGTERM/SIGINT (each worker drains, see
proxy/runtime/server.py), SIGHUP (reload) and SIGUSR1 (recycle) on.

A worker killed by a signal (kill -9, the OOM killer) is forked again at once while the others
serve on: the listening socket is the parent's, so no connection is refused meanwhile (only
the killed worker's requests in flight are lost). A worker killed RESPAWN_LIMIT times within
RESPAWN_WINDOW_S, or one that exits with an error of its own (a bug, a store it cannot reach
at start), takes the others down with it (they drain) and the parent exits non-zero: whatever
supervises it restarts the whole, rather than a crash loop or a half that silently serves
with fewer workers.

A worker that leaves for a fresh one (its memory past `server.max_rss_mb`, or SIGUSR1; see
proxy/runtime/recycle.py) stops accepting and says so; the parent forks its successor at once, while
the old worker finishes its requests and exits with RECYCLE_EXIT. The parent keeps the
listening socket open for that: connections that arrive while no worker accepts wait in its
backlog.

Guard state (loop levels, budgets, circuits) must stay exact across workers: with the embedded
store it lives in each process's memory, so more than one worker needs store.backend: redis,
and `refusal` says so at start.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from proxy.policies.spec import Config
from proxy.runtime.recycle import RECYCLE_EXIT

log = logging.getLogger("agentproxy")

READY_TIMEOUT_S = 120.0  # a cold start that imports litellm takes a few seconds
RESPAWN_LIMIT = 5  # workers killed within RESPAWN_WINDOW_S before the parent gives up
RESPAWN_WINDOW_S = 60.0


def workers_from(value: str) -> int:
    """`--workers`: a count, or `auto` for one per core."""
    if value == "auto":
        return os.cpu_count() or 1
    count = int(value)
    if count < 1:
        raise ValueError("--workers must be 1 or more, or auto")
    return count


def refusal(config: Config, workers: int) -> str | None:
    """Why `workers` processes cannot serve this configuration, or None."""
    if workers > 1 and config.store.backend != "redis":
        return (
            f"--workers {workers} needs the Redis store (store: {{backend: redis, url: ...}}): "
            "with the embedded store each worker would keep its own loop levels, budgets and "
            "circuits, and none of them would be exact; run one worker, or point every worker "
            "at one Redis"
        )
    return None


SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
READY, LEAVING = "ready", "leaving"  # what a worker tells the parent


def run(
    workers: int,
    host: str,
    port: int,
    serve_one: Callable[[socket.socket, Callable[[str], None], bool], int],
    banner: str,
    say: Callable[[str], None] = lambda text: print(text, flush=True),
    ready: Callable[[], None] = lambda: None,
) -> int:
    """Fork `workers` processes, each calling `serve_one(listening socket, tell, replacing)`
    (`tell(READY)` once it listens, `tell(LEAVING)` when it leaves for a successor;
    `replacing`: it succeeds one); `ready()` once they all listen; return once they have all
    exited: 0 if each drained and exited 0."""
    listener = socket.create_server((host, port), backlog=1024)
    context = multiprocessing.get_context("fork")
    # Workers tell the parent what they do with one small write each (atomic on a pipe).
    news, tell = context.Pipe(duplex=False)

    def worker(replacing: bool) -> None:
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_DFL)  # the worker's own loop handles them
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # one sent meanwhile: its default
        news.close()
        code = serve_one(listener, lambda event: tell.send((event, os.getpid())), replacing)
        sys.stdout.flush()
        os._exit(code)

    def fork(replacing: bool = False) -> BaseProcess:
        # Signals wait while a child is forked: until `worker` resets them the child has the
        # parent's handler, which would take a stop as the parent's and go on serving.
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            child = context.Process(target=worker, args=(replacing,))
            child.start()
            children.append(child)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # the parent's: `forward`
        if stopping and child.pid is not None:  # the stop came while it was being forked
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
        return child

    children: list[BaseProcess] = []
    stopping = False

    def forward(sig: int, _frame: Any) -> None:
        nonlocal stopping
        if sig in (signal.SIGTERM, signal.SIGINT) and not stopping:
            stopping = True
            listener.close()  # new connections are refused now, not queued for no one
        for child in children:
            if child.pid is not None and child.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM if sig == signal.SIGINT else sig)

    for sig in SIGNALS:
        signal.signal(sig, forward)
    for _ in range(workers):
        fork()
    if _announce(list(children), news, banner, say):
        ready()
    try:
        return _supervise(children, lambda: stopping, forward, fork, news)
    finally:
        listener.close()


def _announce(
    children: list[BaseProcess], news: Connection, banner: str, say: Callable[[str], None]
) -> bool:
    """Print the banner once every worker listens (nothing if one fails first); whether they
    all do."""
    waiting = len(children)
    while waiting:
        sentinels = [c.sentinel for c in children if c.exitcode is None]
        woke = wait([news, *sentinels], timeout=READY_TIMEOUT_S)
        if news not in woke:
            return False  # a worker exited before it was ready (or never got there): see _supervise
        if news.recv()[0] == READY:
            waiting -= 1
    first, newline, rest = banner.partition("\n")  # the count on its first line
    say(f"{first} [{len(children)} workers]{newline}{rest}")
    return True


def _supervise(
    children: list[BaseProcess],
    stopping: Callable[[], bool],
    forward: Callable[[int, Any], None],
    fork: Callable[[bool], BaseProcess],
    news: Connection,
) -> int:
    worst = 0
    replaced: set[int] = set()  # workers that left and have a successor already
    killed: list[float] = []  # when workers were killed, within the last RESPAWN_WINDOW_S
    while children:  # the workers not yet reaped (a successor joins them)
        for woke in wait([news, *(c.sentinel for c in children)]):
            if woke is news:
                event, pid = news.recv()
                if event == READY:
                    log.info("worker %s is serving", pid)
                elif event == LEAVING and not stopping():
                    replaced.add(pid)
                    log.info("worker %s hands over: worker %s replaces it", pid,
                             fork(True).pid)  # fmt: skip
                continue
            child = next(c for c in children if c.sentinel == woke)
            child.join()
            children.remove(child)
            code = child.exitcode or 0
            if code == RECYCLE_EXIT:  # it drained; a successor serves in its place
                if child.pid not in replaced and not stopping():  # (it left without saying so)
                    log.info("worker %s left: worker %s replaces it", child.pid, fork(True).pid)
                replaced.discard(child.pid or 0)
                continue
            if code < 0 and not stopping() and _may_respawn(killed):
                log.error("worker %s was killed by signal %d: worker %s replaces it (its "
                          "requests in flight were lost)", child.pid, -code,
                          fork(True).pid)  # fmt: skip
                continue
            if stopping() and code in (-signal.SIGTERM, -signal.SIGINT):
                code = 0  # stopped before its loop took the signal over: nothing to drain
            worst = worst or code
            if not stopping():
                log.error("worker %s exited with %s: stopping the others", child.pid, code)
                forward(signal.SIGTERM, None)
                worst = worst or 1
    return worst


def _may_respawn(killed: list[float]) -> bool:
    """Whether another killed worker may be replaced: fewer than RESPAWN_LIMIT were within the
    last RESPAWN_WINDOW_S (a worker the OS kills at every start is a crash loop)."""
    now = time.monotonic()
    killed[:] = [at for at in killed if now - at < RESPAWN_WINDOW_S]
    killed.append(now)
    return len(killed) <= RESPAWN_LIMIT
