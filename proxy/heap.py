"""The C allocator, asked to give back what the process no longer holds.

Request bodies and the memos' objects come from the same heap; long-lived objects left between
freed ones keep glibc's malloc from shrinking it. The collector trims the heap (`trim`) when
the process has been quiet for a while, handing the free pages back. (Pinning glibc's mmap
threshold at 128 KiB keeps every large block off the heap, but costs an mmap and its page
faults each time: ~25 µs per 30 KB turn, orjson's parse buffer being ~10x the body, ~3 ms per
1 MB body; and in bench/load.py at ~200 req/s RSS grew as fast with it as without, about
4 MB/min at 10-15 minutes. Not done. Nor are trims under load, once a minute: 3-8 ms each and
20-40 MB back for a moment, but at ~235 req/s RSS grew as before, +2.2-2.9 MB/min after 600 s;
glibc's own figures showed the heap's free space as chunks between live ones, not whole pages a
trim could return. Capping malloc arenas at two moved the threads' ~60 MB into the main heap
and saved nothing. jemalloc, preloaded, grew alike, +2.5 MB/min at ~320 req/s, and kept its
pages after the traffic. heaptrack shows the bytes in use levelling off once the memos are full
while the heap keeps growing: free space between live chunks. Decoding JSON with msgspec, which
needs no parse buffer, grew alike too. At 32 KiB instead of 128 the pin does slow the growth,
+1.4 against +3.4 MB/min, but each large block's fresh pages cost ~5 µs a fault on a microVM:
~17 % more CPU per request. The operator's choice (MALLOC_MMAP_THRESHOLD_=32768,
docs/operations.md#memory), not a default.)

Elsewhere than glibc (musl, macOS) `trim` is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time

log = logging.getLogger("agentproxy")

MIN_TRIM_GAP_S = 30.0  # a trim walks the whole heap: at most this often


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


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
