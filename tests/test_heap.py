"""The allocator hands pages back: a trim returns freed heap to the system, at most every
MIN_TRIM_GAP_S."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from proxy import heap

pytestmark = pytest.mark.skipif(heap._LIBC is None, reason="glibc only: elsewhere a no-op")


def test_a_trim_runs_then_waits_for_its_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_last_trim", 0.0)
    assert heap.trim() is True
    assert heap.trim() is False, "a second trim within the gap is skipped"


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
