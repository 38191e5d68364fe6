"""The C allocator, asked to give back what the process no longer holds.

Request bodies and the memos' objects come from the same heap; long-lived objects left between
freed ones keep glibc's malloc from shrinking it. The collector trims the heap, handing the free
pages back: once the process has been quiet for a while (`trim`), and under load once a minute
while a trim stays cheap (`trim_busy`; measured in bench/load.py at ~250 req/s: 3-8 ms for
~20-40 MB of a 430 MB process). The threads (the store's, the tokenizer's) share the main
thread's heap plus one (`limit_arenas`) instead of one 64 MB arena each, which they filled in
part and never gave back (~60 MB of RSS in six arenas). (Pinning glibc's mmap
threshold at 128 KiB keeps every large block off the heap, but costs an mmap and its page
faults each time: ~25 µs per 30 KB turn, orjson's parse buffer being ~10x the body, ~3 ms per
1 MB body; and in bench/load.py at ~200 req/s RSS grew as fast with it as without, about
4 MB/min at 10-15 minutes. Not done.)

Elsewhere than glibc (musl, macOS) `trim` is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time

log = logging.getLogger("agentproxy")

MIN_TRIM_GAP_S = 30.0  # a trim walks the whole heap: at most this often
BUSY_TRIM_EVERY_S = 60.0  # under load: at most this often...
BUSY_TRIM_MAX_S = 0.02  # ...and only while the last trim held the loop less than this
M_ARENA_MAX = -8  # glibc's mallopt parameter
ARENAS = 2


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


_LIBC = _libc()
_last_trim = 0.0
_last_took = 0.0  # seconds the last trim held the calling thread


def limit_arenas() -> None:
    """Threads started from now on share ARENAS malloc arenas (glibc's default: 8 per core)."""
    if _LIBC is not None:
        _LIBC.mallopt(M_ARENA_MAX, ARENAS)


def trim() -> bool:
    """Give the heap's free pages back to the system, unless done less than MIN_TRIM_GAP_S ago.
    True when it ran."""
    global _last_trim, _last_took
    now = time.monotonic()
    if _LIBC is None or now - _last_trim < MIN_TRIM_GAP_S:
        return False
    _last_trim = now
    _LIBC.malloc_trim(0)
    _last_took = time.monotonic() - now
    log.debug("heap trimmed in %.1f ms", _last_took * 1000)
    return True


def trim_busy() -> bool:
    """`trim` while requests are under way: at most every BUSY_TRIM_EVERY_S, and not while the
    last trim took BUSY_TRIM_MAX_S or longer (a huge, fragmented heap: quiet spells still trim
    it, and a cheap one there lets busy trims resume). True when it ran."""
    if _last_took >= BUSY_TRIM_MAX_S or time.monotonic() - _last_trim < BUSY_TRIM_EVERY_S:
        return False
    return trim()
