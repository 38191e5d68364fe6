"""A recycled worker's guard state, saved and taken back by its successor: every entry with
its own expiry, in its recency order, nothing that had expired; the file read once, by its
owner only. The changes either makes while both serve reach the other.
(tests/runtime/test_workers.py recycles real workers under load and counts one budget across
both.)"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from pathlib import Path

import orjson
import pytest

from proxy.runtime.handover import (
    Handover,
    HandoverState,
    handover_path,
    journal_path,
    save,
    take,
)
from proxy.store.state import MemoryState


async def test_the_successor_gets_every_live_entry_with_its_own_expiry(tmp_path: Path) -> None:
    before = MemoryState()
    await before.set("guards", "key:a/s1", b"\x00loop level 2\xff", ttl_s=3600)
    await before.set("lineage", "key:a/s1", b"tip")  # the default ttl (7 days)
    await before.set("guards", "key:b/s1", b"gone", ttl_s=0.01)
    await before.add("budget", "key:a/s1", {"calls": 3, "tokens": 1200.5}, ttl_s=600)
    await before.add("budget", "key:b/s1", {"calls": 1})
    await before.publish("circuits", "sim#0", 1.0, ttl_s=30)
    await before.publish("circuits", "old#0", 1.0, ttl_s=0.01)
    await asyncio.sleep(0.02)  # the 10 ms entries are past their time
    await before.get("guards", "key:a/s1")  # now the most recently used value

    path = handover_path(tmp_path)
    assert save(before, path) == 4
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

    after = MemoryState()
    assert take(after, path) == (4, os.getpid())  # and who left it: its journal follows
    assert not path.exists()  # read once
    # Recency survives: the least recently used value is the one evicted first, as before.
    assert [key for key, *_ in after._values.rows()] == [
        ("lineage", "key:a/s1"),
        ("guards", "key:a/s1"),
    ]
    assert await after.get("guards", "key:a/s1") == b"\x00loop level 2\xff"
    assert await after.get("lineage", "key:a/s1") == b"tip"
    assert await after.get("guards", "key:b/s1") is None
    assert await after.counters("budget", "key:a/s1") == {"calls": 3, "tokens": 1200.5}
    assert await after.counters("budget", "key:b/s1") == {"calls": 1}
    assert await after.published("circuits") == {"sim#0": 1.0}
    # Expiries are the predecessor's, not restarted: ~1 hour left, ~10 minutes, ~7 days.
    rows = {key: expiry - time.time() for key, _, expiry, _ in after._values.rows()}
    assert 3590 < rows[("guards", "key:a/s1")] <= 3600
    assert 6.9 * 86400 < rows[("lineage", "key:a/s1")] <= 7 * 86400
    counters = {key: expiry - time.time() for key, _, expiry, _ in after._counters.rows()}
    assert 590 < counters[("budget", "key:a/s1")] <= 600


async def test_nothing_to_take_and_an_unreadable_file_start_empty(tmp_path: Path) -> None:
    state = MemoryState()
    path = handover_path(tmp_path)
    assert take(state, path) == (0, None)
    path.write_bytes(b"{not json")
    assert take(state, path) == (0, None)
    assert not path.exists()  # dropped, not tried again by the next worker
    assert await state.counters("budget", "key:a/s1") == {}


@pytest.mark.parametrize("ttl_s", [None, 60.0])
async def test_a_restored_entry_still_expires_in_time(tmp_path: Path, ttl_s: float | None) -> None:
    before = MemoryState(default_ttl_s=0.05)
    await before.add("budget", "key:a/s", {"calls": 1}, ttl_s=ttl_s)
    path = handover_path(tmp_path)
    save(before, path)
    after = MemoryState(default_ttl_s=0.05)
    take(after, path)
    await asyncio.sleep(0.06)
    expected = {} if ttl_s is None else {"calls": 1}
    assert await after.counters("budget", "key:a/s") == expected


async def test_changes_reported_by_one_state_are_made_in_another() -> None:
    """What two workers exchange through their journals while both serve: every write is
    reported once, a peer's change is made without being reported again, and counters add
    up (both workers' calls count)."""
    old, new = HandoverState(MemoryState()), HandoverState(MemoryState())
    await old.add("budget", "key:a/s", {"calls": 3}, ttl_s=600)
    await new.add("budget", "key:a/s", {"calls": 3}, ttl_s=600)  # as taken from the snapshot
    heard: list[list[object]] = []
    old.changed = new.changed = heard.append
    await old.add("budget", "key:a/s", {"calls": 1}, first={"since": 5.0}, ttl_s=600)
    await new.add("budget", "key:a/s", {"calls": 1}, ttl_s=600)
    await old.set("guards", "key:a/s", b"\x00level 2")
    await old.publish("circuits", "sim#0", 1.0, ttl_s=30)
    await new.delete("lineage", "key:a/s")
    from_old, from_new = [heard[0], heard[2], heard[3]], [heard[1], heard[4]]
    for change in from_old:
        new.apply(orjson.loads(orjson.dumps(change)))  # as the journal carries it
    for change in from_new:
        old.apply(orjson.loads(orjson.dumps(change)))
    assert len(heard) == 5  # applying reported nothing more
    for state in (old, new):
        assert await state.counters("budget", "key:a/s") == {"calls": 5, "since": 5.0}
        assert await state.published("circuits") == {"sim#0": 1.0}
    assert await new.get("guards", "key:a/s") == b"\x00level 2"
    with pytest.raises(ValueError, match="not a state change"):
        new.apply(["rename", "a", "b"])


async def test_a_leaving_worker_skips_what_it_cannot_read_and_serves_on(tmp_path: Path) -> None:
    """Fail-safe: a stray file named like a journal, and a journal line that is not a change,
    are logged and skipped; the state goes on answering and the good changes are made."""
    leaving = Handover(enabled=True)
    state = leaving.around(MemoryState())
    assert isinstance(state, HandoverState) and leaving.installed
    leaving.attach(tmp_path)
    await state.add("budget", "key:a/s", {"calls": 3})
    assert leaving.leave() == 1
    (tmp_path / f"handover-{os.getppid()}-not-a-pid.jsonl").write_bytes(b"junk")
    peer = os.getppid()  # a live process, standing in for the successor
    journal_path(tmp_path, peer).write_bytes(
        b'{"not": "a change"}\n["add", "budget", "key:a/s", {"calls": 1}, {}, null]\n["se'
    )
    assert await state.counters("budget", "key:a/s") == {"calls": 4}
    with journal_path(tmp_path, peer).open("ab") as more:  # the rest of the half-written line
        more.write(b't", "guards", "key:a/s", "bGV2ZWw=", 60]\n')
    assert await state.get("guards", "key:a/s") == b"level"
    leaving.close()


async def test_the_state_is_wrapped_only_in_a_worker_a_parent_replaces(tmp_path: Path) -> None:
    """The journals live in a wrapper the runtime puts around in-memory state only when the
    worker is recycled; the state itself keeps no hooks, and a wrapper not journalling passes
    every call on unchanged."""
    alone = Handover(enabled=False)
    state = MemoryState()
    assert alone.around(state) is state and not alone.installed
    assert not hasattr(state, "changed") and not hasattr(state, "catch_up")

    replaced = Handover(enabled=True)
    wrapped = replaced.around(state)
    assert isinstance(wrapped, HandoverState) and wrapped.inner is state
    assert replaced.attach(tmp_path) == 0  # no predecessor: nothing taken, no journal
    assert wrapped.changed is None and wrapped.catch_up is None
    assert await wrapped.add("budget", "key:a/s", {"calls": 2}, first={"since": 1.0}) == {
        "calls": 2,
        "since": 1.0,
    }
    await wrapped.set("guards", "key:a/s", b"level")
    await wrapped.publish("circuits", "sim#0", 1.0, ttl_s=30)
    assert await state.counters("budget", "key:a/s") == {"calls": 2, "since": 1.0}
    assert await state.get("guards", "key:a/s") == b"level"
    assert await wrapped.published("circuits") == {"sim#0": 1.0}
    await wrapped.delete("guards", "key:a/s")
    assert await wrapped.get("guards", "key:a/s") is None
    assert await asyncio.to_thread(os.listdir, tmp_path) == []
