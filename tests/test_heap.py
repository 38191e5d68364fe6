"""The allocator hands pages back: a trim returns freed heap to the system, at most every
MIN_TRIM_GAP_S, and under load only while trims stay cheap; threads share a few arenas."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time

import pytest

from proxy import heap

pytestmark = pytest.mark.skipif(heap._LIBC is None, reason="glibc only: elsewhere a no-op")


def test_a_trim_runs_then_waits_for_its_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_last_trim", 0.0)
    assert heap.trim() is True
    assert heap.trim() is False, "a second trim within the gap is skipped"


def test_a_busy_trim_paces_itself_and_stops_while_trims_are_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    monkeypatch.setattr(heap, "_last_trim", 0.0)
    monkeypatch.setattr(heap, "_last_took", 0.0)
    assert heap.trim_busy() is True
    now[0] += heap.BUSY_TRIM_EVERY_S - 1
    assert heap.trim_busy() is False, "within a minute of the last trim"
    now[0] += 1
    assert heap.trim_busy() is True
    monkeypatch.setattr(heap, "_last_took", heap.BUSY_TRIM_MAX_S)
    now[0] += 10 * heap.BUSY_TRIM_EVERY_S
    assert heap.trim_busy() is False, "the last trim held the loop too long"
    assert heap.trim() is True, "a quiet spell still trims..."
    now[0] += heap.BUSY_TRIM_EVERY_S
    assert heap.trim_busy() is True, "...and, cheap (0 ms on a frozen clock), lets busy ones resume"


ARENAS_SCRIPT = """
import ctypes, re, sys, threading
from proxy import heap

if sys.argv[1] == "limited":
    heap.limit_arenas()
libc = ctypes.CDLL("libc.so.6")
kept = []
together = threading.Barrier(6)
def work():  # a thread's first malloc picks its arena; a thread gone hands its arena on
    kept.append(bytearray(100_000))
    together.wait()
threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
buf, size = ctypes.c_char_p(), ctypes.c_size_t()
libc.open_memstream.restype = ctypes.c_void_p
stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
libc.malloc_info(0, ctypes.c_void_p(stream))
libc.fclose(ctypes.c_void_p(stream))
print(len(re.findall(rb"<heap nr=", buf.value)))
"""


@pytest.mark.parametrize("mode", ["limited", "default"])
def test_threads_share_a_few_arenas(mode: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", ARENAS_SCRIPT, mode],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    arenas = int(out)
    if mode == "limited":
        assert arenas <= heap.ARENAS
    else:  # the control: without the limit each thread takes an arena of its own
        assert arenas > heap.ARENAS


def test_freed_memory_goes_back_to_the_system() -> None:
    """In a fresh process: many mid-sized blocks (below the mmap threshold, so on the heap)
    pinned by a few survivors at the top; freed, a trim gives most of the pages back."""
    script = textwrap.dedent(
        """
        import re
        from proxy import heap

        def rss_mb():
            status = open("/proc/self/status").read()
            return int(re.search(r"VmRSS:\\s+(\\d+)", status).group(1)) / 1024

        blocks = [bytearray(64 * 1024) for _ in range(3000)]  # ~190 MB on the heap
        survivors = blocks[-1:]  # the top of the heap stays in use
        full = rss_mb()
        del blocks
        freed = rss_mb()
        heap._last_trim = 0.0
        heap.trim()
        print(full, freed, rss_mb())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    full, freed, trimmed = map(float, re.findall(r"[\d.]+", out))
    assert freed > full / 2, "freed but pinned: glibc kept the pages"
    assert trimmed < full / 4, (full, freed, trimmed)
