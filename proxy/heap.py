"""The C allocator, kept from fragmenting and asked to give back what the process no longer
holds.

Every request allocates large short-lived blocks: its body, orjson's parse buffer (about ten
times the body: ~340 KB for a 30 KB turn), the body sent on. The memos' objects live for
minutes, from the same heap. glibc's malloc serves large blocks with mmap, so they go straight
back to the system when freed, but it raises that threshold to the size of every mmapped block
freed (up to 32 MiB): soon they are carved from the heap, between long-lived objects, and
the heap only grows: bench/load.py (50 agents, 30 minutes) measured RSS +4 MB/min after
warm-up at glibc's default, under 1 MB/min with the threshold pinned at glibc's starting
128 KiB (docs/operations.md, "Load and soak"). So at start it is pinned there
(`pin_mmap_threshold`); the price is one mmap and its page faults per large block: ~25 µs per
30 KB turn (orjson's buffer), ~3 ms per 1 MB body. `MALLOC_MMAP_THRESHOLD_` in the
environment is glibc's own setting and wins.

The collector also trims the heap (`trim`) when the process has been quiet for a while,
handing the free pages back. Elsewhere than glibc (musl, macOS) both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time

log = logging.getLogger("agentproxy")

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value, kept for good
MIN_TRIM_GAP_S = 30.0  # a trim walks the whole heap: at most this often


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _libc()
_last_trim = 0.0


def pin_mmap_threshold() -> bool:
    """Keep large blocks on mmap for the process's life (True when glibc agreed), unless the
    environment set the threshold itself."""
    if _LIBC is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1)


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
