"""Every Store backend behaves alike; the local one also survives restarts and bad disks."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from proxy.policies.spec import StoreSettings
from proxy.store.base import BlobInfo, Store, StoreError, content_ref
from proxy.store.local import LocalStore
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisConnection, RedisStore
from tests.conftest import REDIS_URL


def blob(session: str, data: bytes, *, owner: str | None = "alice", at: float = 1.0) -> BlobInfo:
    ref = content_ref(session, "tool_result", data)
    return BlobInfo(ref, session, "tool_result", len(data), at, owner, {"tool": "read_file"})


@pytest.fixture(params=["memory", "local", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    backend: Store
    if request.param == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        redis = RedisConnection(StoreSettings(backend="redis", url=REDIS_URL, prefix=prefix))
        backend = RedisStore(redis)
    else:
        backend = MemoryStore() if request.param == "memory" else LocalStore(str(tmp_path))
    yield backend
    await backend.close()
    if request.param == "redis":
        await redis.close()


# -- the behaviour every backend shares ---------------------------------------------------------


async def test_put_then_get_returns_info_and_bytes(store: Store) -> None:
    info = blob("s1", b"hello \xe2\x9c\x93 world")
    await store.put(info, b"hello \xe2\x9c\x93 world")
    assert await store.get(info.ref) == (info, b"hello \xe2\x9c\x93 world")
    assert await store.get("ap_unknown") is None


async def test_put_is_idempotent_and_keeps_the_first_info(store: Store) -> None:
    first = blob("s1", b"same", at=1.0)
    await store.put(first, b"same")
    await store.put(blob("s1", b"same", at=2.0, owner="bob"), b"same")
    assert await store.get(first.ref) == (first, b"same")
    assert await store.blobs("s1") == [first]


async def test_blobs_lists_one_session_in_write_order(store: Store) -> None:
    a, b, other = blob("s1", b"a", at=1.0), blob("s1", b"b", at=2.0), blob("s2", b"c")
    for info, data in ((a, b"a"), (other, b"c"), (b, b"b")):
        await store.put(info, data)
    assert await store.blobs("s1") == [a, b]
    assert await store.blobs("nobody") == []


async def test_search_is_case_insensitive_and_scoped_to_the_session(store: Store) -> None:
    text = "x" * 500 + " The Needle is HERE " + "y" * 500
    await store.put(blob("s1", text.encode()), text.encode())
    await store.put(blob("s2", b"needle elsewhere"), b"needle elsewhere")
    found = await store.search("s1", "the needle")
    assert len(found) == 1
    info, snippet = found[0]
    assert info.session == "s1"
    assert "The Needle is HERE" in snippet
    at = text.lower().find("the needle")
    # One 1,020-char line: a window centred on the hit, capped.
    assert snippet == text[at - 200 : at + 400]
    assert await store.search("s1", "absent") == []


async def test_search_snippets_are_the_lines_around_the_hit(store: Store) -> None:
    text = "\n".join(f"line {i}" for i in range(100)).replace("line 50", "line 50 ERROR here")
    await store.put(blob("s1", text.encode()), text.encode())
    ((_, snippet),) = await store.search("s1", "error")
    assert snippet == "line 49\nline 50 ERROR here\nline 51"


async def test_search_folds_non_ascii_case_and_respects_limit(store: Store) -> None:
    for i in range(4):
        data = f"{i}: Grüße aus ÜBERLINGEN".encode()
        await store.put(blob("s1", data), data)
    found = await store.search("s1", "überlingen", limit=3)
    assert [snippet for _, snippet in found] == [f"{i}: Grüße aus ÜBERLINGEN" for i in range(3)]


async def test_checkpoints_are_per_session_and_overwritable(store: Store) -> None:
    assert await store.get_checkpoint("s1", "k") is None
    await store.put_checkpoint("s1", "k", b"one")
    await store.put_checkpoint("s2", "k", b"other")
    await store.put_checkpoint("s1", "k", b"two")
    assert await store.get_checkpoint("s1", "k") == b"two"
    assert await store.get_checkpoint("s2", "k") == b"other"


# -- the local backend --------------------------------------------------------------------------


async def test_local_store_survives_a_restart(tmp_path: Path) -> None:
    info = blob("s1", b"kept across restarts")
    first = LocalStore(str(tmp_path))
    await first.put(info, b"kept across restarts")
    await first.put_checkpoint("s1", "prefix", b"summary")
    await first.close()

    second = LocalStore(str(tmp_path))
    try:
        assert await second.get(info.ref) == (info, b"kept across restarts")
        assert await second.get_checkpoint("s1", "prefix") == b"summary"
        assert await second.search("s1", "ACROSS") == [(info, "kept across restarts")]
    finally:
        await second.close()
    assert (tmp_path / "store.sqlite3").exists()


async def test_local_store_takes_many_concurrent_puts(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    payloads = [f"payload {i}".encode() * 100 for i in range(200)]
    try:
        await asyncio.gather(
            *(store.put(blob("s1", p, at=float(i)), p) for i, p in enumerate(payloads))
        )
        listed = await store.blobs("s1")
        assert [info.size for info in listed] == [len(p) for p in payloads]
        for p in payloads:
            found = await store.get(content_ref("s1", "tool_result", p))
            assert found is not None and found[1] == p
    finally:
        await store.close()


async def test_local_store_cache_stays_within_its_byte_bound(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path), cache_bytes=10_000)
    payloads = [bytes([65 + i % 26]) * 1_000 for i in range(50)]
    try:
        for i, p in enumerate(payloads):
            await store.put(blob("s1", p + str(i).encode()), p + str(i).encode())
            assert store.cached_bytes <= 10_000
        huge = b"z" * 50_000  # larger than the whole cache: stored, never cached
        await store.put(blob("s1", huge), huge)
        assert await store.get(content_ref("s1", "tool_result", huge)) is not None
        for i, p in enumerate(payloads):  # the evicted ones come back from disk
            found = await store.get(content_ref("s1", "tool_result", p + str(i).encode()))
            assert found is not None and found[1] == p + str(i).encode()
            assert store.cached_bytes <= 10_000
    finally:
        await store.close()


async def test_unusable_directory_raises_store_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("in the way")
    store = LocalStore(str(not_a_dir / "data"))
    with pytest.raises(StoreError, match=r"local store .*file/data/store\.sqlite3: cannot open"):
        await store.open()
    with pytest.raises(StoreError):
        await store.put(blob("s1", b"x"), b"x")
    await store.close()


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    tmp_path.chmod(0o500)
    yield tmp_path
    tmp_path.chmod(0o700)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
async def test_read_only_directory_raises_store_error(read_only_dir: Path) -> None:
    store = LocalStore(str(read_only_dir / "data"))
    with pytest.raises(StoreError, match="cannot open"):
        await store.put(blob("s1", b"x"), b"x")
    await store.close()


async def test_full_disk_raises_store_error_and_the_store_recovers(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    await store.open()

    def cap(db: sqlite3.Connection, pages: int | None) -> None:
        count = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages or count}")

    # Reaching into the worker is the only way to simulate a full disk without filling one.
    await store._run("cap", lambda db: cap(db, None))
    big = os.urandom(200_000)
    with pytest.raises(StoreError, match="full"):
        await store.put(blob("s1", big), big)
    await store._run("uncap", lambda db: cap(db, 1_000_000))
    await store.put(blob("s1", big), big)
    assert await store.get(content_ref("s1", "tool_result", big)) is not None
    await store.close()


async def test_closed_store_raises_store_error(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    await store.close()
    await store.close()  # twice is fine
    with pytest.raises(StoreError, match="after close"):
        await store.get("ap_x")
