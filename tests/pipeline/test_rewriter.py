"""The rewriter forgets idle sessions: no memo names them after, so their next turn writes
what it needs again (the store may have evicted it meanwhile)."""

from __future__ import annotations

from typing import Any

from proxy.pipeline.rewriter import Rewriter
from tests.pipeline.factories import context, exchange
from tests.pipeline.test_offload import POLICY, CountingStore, history, numbered


def sessions_named(rewriter: Rewriter) -> set[str]:
    named: set[str] = set()
    for memo in rewriter.memos().values():
        for key in memo:
            named.add(key if isinstance(key, str) else key[0])
    return named


async def turn(rewriter: Rewriter, session: str, result: str) -> Any:
    ex = exchange(history(result), POLICY, session=session)
    await rewriter.before_call(ex)
    return ex


async def test_forget_drops_every_memo_of_the_sessions_and_only_theirs() -> None:
    store = CountingStore()
    rewriter = Rewriter(context(store))
    for session in ("key:a/s1", "key:a/s2"):
        await turn(rewriter, session, numbered(60))
    assert {"key:a/s1", "key:a/s2"} <= sessions_named(rewriter)
    warm = store.puts
    await turn(rewriter, "key:a/s1", numbered(60))
    assert store.puts == warm, "a warm turn trusts its memos: no write"

    rewriter.forget({"key:a/s1"})

    assert "key:a/s1" not in sessions_named(rewriter)
    assert "key:a/s2" in sessions_named(rewriter)
    assert rewriter.compaction.index.peek("key:a/s1") is None
    await turn(rewriter, "key:a/s1", numbered(60))
    assert store.puts == warm + 1, "after forgetting, the pointer's content is written again"
