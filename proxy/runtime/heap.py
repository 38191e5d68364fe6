"""The C allocator: large blocks kept off the main heap, and what the process no longer holds
given back.

`pin_mmap_threshold` (`server.mmap_threshold_kb`, 32 by default): a block of 32 KiB or more
that the main heap's free space cannot hold gets a mapping of its own, returned whole when
freed, instead of growing the heap. glibc's own threshold rises with the largest block freed,
up to 32 MiB (orjson's parse buffer is over ten times a body), so request bodies, parse buffers
and the long tool results the memos keep would all grow the main heap; long-lived ones left
between short-lived ones fragment it, and under sustained load RSS kept growing for about 40
minutes (bench/README.md, load.py). Pinned, with the memos forgetting a session idle for a
minute (`server.memo_idle_s`), the main heap stays flat. Its price: each large block starts on
fresh pages (a page fault is ~5 µs on a microVM), ~10 % more CPU per request in that soak.

The collector also trims the heap (`trim`) once the process has been quiet for a while, handing
its free pages back. Tried and not kept (each measured in bench/README.md): the pin at 128 KiB
(the 30-100 KB tool results stayed on the heap), trims under load, two malloc arenas, jemalloc,
msgspec instead of orjson, and the pin or the minute alone (each still grew 1.4-1.5 MB/min).

Elsewhere than glibc (musl, macOS) both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time

log = logging.getLogger("agentproxy")

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MIN_TRIM_GAP_S = 30.0  # a trim walks the whole heap: at most this often


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _libc()
_last_trim = 0.0


def trim() -> bool:
    """Give the heap's free pages back to the system, unless done less than MIN_TRIM_GAP_S ago.
    True when it ran."""
    global _last_trim
    now = time.monotonic()
    if _LIBC is None or now - _last_trim < MIN_TRIM_GAP_S:
        return False
    _last_trim = now
    _LIBC.malloc_trim(0)
    log.debug("heap trimmed in %.1f ms", (time.monotonic() - now) * 1000)
    return True


def pin_mmap_threshold(kb: int | None) -> str:
    """From now on a block of `kb` KiB or more gets a mapping of its own rather than grow the
    main heap (None: glibc's rising default). `MALLOC_MMAP_THRESHOLD_` in the environment,
    which glibc has applied already, wins. Says what it did, for the log."""
    if _LIBC is None:
        return "mmap threshold: not glibc, left to the allocator"
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return "mmap threshold: MALLOC_MMAP_THRESHOLD_ from the environment"
    if kb is None:
        return "mmap threshold: glibc's default"
    if not _LIBC.mallopt(M_MMAP_THRESHOLD, kb * 1024):
        return f"mmap threshold: glibc refused {kb} KiB, left at its default"
    return f"mmap threshold: {kb} KiB"
