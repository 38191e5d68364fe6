"""When pytest-timeout stops a test, what its event loop was waiting on.

pytest-timeout dumps the threads' stacks, where an asyncio test shows only the loop's select.
This adds the pending tasks and every suspended coroutine and async generator with the line it
waits at (a task's own stack stops at its first await of a generator's __anext__, where
fixtures' and aiohttp's cleanups wait), captured in the timeout's signal handler, which runs on
the loop's thread, and repeats them in the terminal summary: the part of a CI log that is kept.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import io
from typing import Any

import pytest
import pytest_timeout

MAX_CHARS = 6000  # the summary's share of a CI log's tail
_dumps: list[str] = []
_timeout_sigalrm = pytest_timeout.timeout_sigalrm


def _pending_tasks() -> str:
    loop = asyncio._get_running_loop()
    if loop is None:
        return "no event loop was running\n"
    out = io.StringIO()
    for task in sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name()):
        out.write(f"task {task.get_name()}: {task.get_coro()!r}\n")
    out.write("suspended coroutines, where each waits:\n")
    for where in sorted(_suspended()):
        out.write(f"  {where}\n")
    return out.getvalue()


def _suspended() -> set[str]:
    found = set()
    for thing in gc.get_objects():
        if inspect.iscoroutine(thing):
            frame, name = thing.cr_frame, thing.__qualname__
        elif inspect.isasyncgen(thing):
            frame, name = thing.ag_frame, thing.__qualname__
        else:
            continue
        if frame is not None and frame.f_lasti >= 0:
            found.add(f"{name} at {frame.f_code.co_filename}:{frame.f_lineno}")
    return found


def _with_tasks(item: Any, settings: Any) -> None:
    __tracebackhide__ = True
    _dumps.append(f"{item.nodeid} timed out; pending tasks:\n{_pending_tasks()}")
    _timeout_sigalrm(item, settings)


pytest_timeout.timeout_sigalrm = _with_tasks  # looked up as a global by its signal handler


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for dump in _dumps:
        terminalreporter.section("tasks pending at a timeout", sep="~")
        text = dump if len(dump) <= MAX_CHARS else dump[:2000] + "\n[...]\n" + dump[-3800:]
        terminalreporter.write(text)
