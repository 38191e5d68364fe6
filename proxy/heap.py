"""The C allocator, asked to give back what the process no longer holds.

Request bodies are large (up to `max_body_bytes`) and short-lived, while the memos' objects
live for minutes; both come from the same heap. glibc's malloc serves big blocks with mmap, so
they go straight back to the system when freed, but it raises that threshold to the size of
every mmapped block freed (up to 32 MiB): after the first large body, later ones are carved
from the heap, between long-lived objects that keep the heap from shrinking. So at start the
threshold is pinned (`pin_mmap_threshold`), and the collector trims the heap (`trim`) when
the process has been quiet for a while, handing the free pages back.

Elsewhere than glibc (musl, macOS) both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
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
    """Keep large blocks on mmap for the process's life (True when glibc agreed)."""
    return _LIBC is not None and _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1


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
