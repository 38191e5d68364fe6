"""Branches of a fingerprinted family: each conversation continues its own, in memory and
across replicas sharing Redis; a store outage leaves the family name in place."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.exchange import Exchange
from proxy.policies.spec import StoreSettings
from proxy.sessions.identity import scoped
from proxy.sessions.lineage import MAX_BRANCHES, Lineage
from proxy.store.base import StoreError
from proxy.store.redis import RedisConnection, RedisState
from proxy.store.state import MemoryState, StateStore
from tests.conftest import REDIS_URL
from tests.pipeline.factories import exchange

FAMILY = "fp-0123456789abcdef"
START: list[dict[str, Any]] = [
    {"role": "system", "content": "agent"},
    {"role": "user", "content": "task"},
]


def request(messages: list[dict[str, Any]], owner: str = "key:a", given: bool = False) -> Exchange:
    ex = exchange(messages, session=scoped(owner, FAMILY))
    ex.identity.owner, ex.identity.session_name, ex.identity.session_given = owner, FAMILY, given
    return ex


def grown(history: list[dict[str, Any]], *texts: str) -> list[dict[str, Any]]:
    for text in texts:
        reply = {"role": "assistant", "content": "ok"}
        history = [*history, reply, {"role": "user", "content": text}]
    return history


async def branch(lineage: Lineage, messages: list[dict[str, Any]], owner: str = "key:a") -> str:
    ex = request(messages, owner)
    await lineage.resolve(ex)
    assert ex.identity.session == scoped(owner, ex.identity.session_name)
    return ex.identity.session_name


async def test_a_given_session_is_left_alone() -> None:
    ex = request(START, given=True)
    await Lineage(MemoryState()).resolve(ex)
    assert ex.identity.session_name == FAMILY


async def test_the_first_conversation_keeps_the_family_name_and_a_twin_gets_its_own() -> None:
    lineage = Lineage(MemoryState())
    assert await branch(lineage, START) == FAMILY
    a = grown(START, "a1")
    b = grown(START, "b1")
    assert await branch(lineage, a) == FAMILY
    twin = await branch(lineage, b)
    assert twin.startswith(FAMILY + "-") and twin != FAMILY
    for step in range(3):  # each goes on in its own branch, interleaved
        a, b = grown(a, f"a{step}"), grown(b, f"b{step}")
        assert await branch(lineage, a) == FAMILY
        assert await branch(lineage, b) == twin
    assert await branch(lineage, b) == twin  # a retry


async def test_a_history_that_continues_no_branch_starts_one() -> None:
    lineage = Lineage(MemoryState())
    long = grown(START, "1", "2", "3")
    await branch(lineage, long)
    # The same start sent again once the first conversation has moved on: a new conversation.
    assert await branch(lineage, START) != FAMILY
    assert await branch(lineage, grown(long, "4")) == FAMILY


async def test_owners_have_their_own_families() -> None:
    lineage = Lineage(MemoryState())
    a = grown(START, "a")
    await branch(lineage, START)
    await branch(lineage, a)
    # Another owner sends the very same histories: none of it touches key:a's branches.
    assert await branch(lineage, grown(START, "x"), owner="key:b") == FAMILY
    assert await branch(lineage, grown(a, "next")) == FAMILY


async def test_branches_per_family_are_bounded() -> None:
    state = MemoryState()
    lineage = Lineage(state)
    for i in range(MAX_BRANCHES + 5):
        await branch(lineage, grown(START, f"variant {i}"))
    raw = await state.get("lineage", scoped("key:a", FAMILY))
    assert raw is not None and raw.count(b"fp-") == MAX_BRANCHES


class Broken(MemoryState):
    async def get(self, space: str, key: str) -> bytes | None:
        raise StoreError("down")


async def test_an_unreadable_store_leaves_the_family_name() -> None:
    assert await branch(Lineage(Broken()), grown(START, "a")) == FAMILY


@pytest.fixture
def replicas(redis_prefix: str) -> tuple[StateStore, StateStore]:
    def connect() -> RedisState:
        settings = StoreSettings(backend="redis", url=REDIS_URL, prefix=redis_prefix, timeout_s=5)
        return RedisState(RedisConnection(settings))

    return connect(), connect()


async def test_replicas_sharing_redis_agree_on_branches(
    replicas: tuple[StateStore, StateStore],
) -> None:
    one, two = Lineage(replicas[0]), Lineage(replicas[1])
    a, b = grown(START, "a"), grown(START, "b")
    assert await branch(one, START) == FAMILY
    assert await branch(two, a) == FAMILY
    twin = await branch(one, b)
    a, b = grown(a, "a2"), grown(b, "b2")
    assert await branch(one, a) == FAMILY  # turns alternate between the replicas
    assert await branch(two, b) == twin
    for state in replicas:
        await state.close()
