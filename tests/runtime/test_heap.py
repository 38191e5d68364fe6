"""The allocator: a pinned mmap threshold keeps large blocks off the main heap (the
environment's own setting winning), and a trim returns freed heap to the system, at most every
MIN_TRIM_GAP_S."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from proxy.runtime import heap

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
        from proxy.runtime import heap

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


def _heap_holds(kb: int | None, env: dict[str, str] | None = None) -> bool:
    """In a fresh process, after pin_mmap_threshold(kb) and a 1 MiB block freed (which raises
    glibc's own threshold past it): does a 512 KiB block grow the main heap for itself, landing
    inside its mapping ([heap] in /proc/self/maps), or get a mapping of its own?"""
    script = textwrap.dedent(
        f"""
        import sys
        from proxy.runtime import heap

        print(heap.pin_mmap_threshold({kb!r}), file=sys.stderr)
        freed = b"x" * (1 << 20)
        del freed
        block = b"x" * (512 * 1024)  # its bytes inline: id() is the block
        for line in open("/proc/self/maps"):
            if line.rstrip().endswith("[heap]"):
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                print(start <= id(block) < end)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True, text=True, check=True, timeout=60, env=env,
    ).stdout  # fmt: skip
    return out.strip() == "True"


def test_a_pinned_threshold_keeps_large_blocks_off_the_main_heap() -> None:
    assert _heap_holds(None), "glibc's own threshold rose with the freed 1 MiB: on the heap"
    assert not _heap_holds(32), "pinned at 32 KiB: a mapping of its own"
    assert _heap_holds(1024), "pinned above it: on the heap"


def test_the_environment_wins_over_the_setting() -> None:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2 * 1024 * 1024)}
    assert _heap_holds(32, env), "the operator's MALLOC_MMAP_THRESHOLD_ is left as it is"


def test_serve_pins_what_the_configuration_says(tmp_path: Path) -> None:
    """`agentproxy serve` applies server.mmap_threshold_kb at start, and says so."""
    config = tmp_path / "p.yaml"
    config.write_text(f"server: {{mmap_threshold_kb: 64}}\nstore: {{path: '{tmp_path}'}}\n")
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", "0"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        while len(lines) < 20 and not any("mmap threshold" in line for line in lines):
            lines.append(proc.stderr.readline())  # its first lines: it logs before it serves
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert any("mmap threshold: 64 KiB" in line for line in lines), lines
