"""The history memo shared by the chain and the lineage: running digests equal to the
lineage's own, one `==` for both on a continued branch, and tenants kept apart; a Gemini
session pays for its new messages only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.exchange import Exchange
from proxy.pipeline.chain import Chain
from proxy.sessions import lineage as lineage_module
from proxy.sessions.history_memo import Digest, HistoryMemo
from proxy.sessions.identity import scoped
from proxy.sessions.lineage import Lineage, digest
from proxy.store.state import MemoryState
from tests.conftest import ProxyFactory
from tests.pipeline.factories import context, exchange
from tests.wire.test_gemini import KEY, start, upstream

__all__ = ["upstream"]  # a fixture (and the simulator's, `sim`, which it takes)

FAMILY = "fp-00000000000000aa"
START: list[dict[str, Any]] = [
    {"role": "system", "content": "agent"},
    {"role": "user", "content": "task", "extra": [1, {"a": None}]},
]


def turn(history: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    return [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": text}]


class CountingList(list[Any]):
    """A history whose comparisons are counted (the memo's copy, swapped in)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountingList.compared += 1
        return list.__eq__(self, other)

    __hash__ = None  # type: ignore[assignment]


@pytest.mark.parametrize("cut", [0, 1, 2, 4])
def test_a_running_digest_is_the_lineage_digest(cut: int) -> None:
    history = turn(turn(START, "a"), "b")
    assert Digest.of(history).value == digest(history)
    extended = Digest.of(history[:cut]).extended(history[cut:])
    assert extended.value == digest(history)
    assert extended.count == len(history)
    assert Digest.of(history).extended([]).value == digest(history)


def request(messages: list[dict[str, Any]], owner: str) -> Exchange:
    ex = exchange(messages, session=scoped(owner, FAMILY))
    ex.identity.owner, ex.identity.session_name, ex.identity.session_given = owner, FAMILY, False
    return ex


async def one_turn(
    lineage: Lineage, chain: Chain, messages: list[dict[str, Any]], owner: str
) -> Exchange:
    ex = request(messages, owner)
    await lineage.resolve(ex)
    await chain.rewrite(ex, context())
    return ex


async def test_a_continued_branch_costs_one_comparison_and_no_serialization_of_the_past(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chain = Chain([])
    lineage = Lineage(MemoryState(), chain.histories)
    first = await one_turn(lineage, chain, START, "key:a")
    seen = chain.histories.get(first.identity.session)
    assert seen is not None and seen.digest is not None
    seen.messages = CountingList(seen.messages)
    CountingList.compared = 0
    hashed: list[int] = []
    real_dumps = lineage_module.orjson.dumps

    def dumps(value: Any, *args: Any) -> bytes:
        if isinstance(value, list) and value and isinstance(value[0], dict):
            hashed.append(len(value))
        return real_dumps(value, *args)

    monkeypatch.setattr("proxy.sessions.history_memo.orjson.dumps", dumps)
    monkeypatch.setattr("proxy.sessions.lineage.orjson.dumps", dumps)
    grown = turn(START, "next")
    ex = await one_turn(lineage, chain, grown, "key:a")
    assert ex.identity.session_name == FAMILY  # the same conversation
    assert ex.rewrite.stable_prefix == len(START)  # the chain took the lineage's comparison
    assert CountingList.compared == 1
    assert hashed == [2]  # only the two new messages were serialized
    assert ex.rewrite.checked is not None and ex.rewrite.checked.digest.value == digest(grown)
    remembered = chain.histories.get(ex.identity.session)
    assert remembered is not None and remembered.digest is ex.rewrite.checked.digest


async def test_another_key_with_the_same_session_never_reads_the_first_keys_memo() -> None:
    chain = Chain([])
    lineage = Lineage(MemoryState(), chain.histories)
    await one_turn(lineage, chain, START, "key:a")
    await one_turn(lineage, chain, turn(START, "a1"), "key:a")
    # Key b sends the same conversation under the same fingerprint: its own family, its own
    # branch state, nothing learnt from key a's memo.
    ex = await one_turn(lineage, chain, turn(START, "a1"), "key:b")
    assert ex.identity.session == scoped("key:b", FAMILY)
    assert ex.rewrite.checked is not None and ex.rewrite.checked.seen is None
    assert ex.rewrite.stable_prefix == 0
    again = await one_turn(lineage, chain, turn(turn(START, "a1"), "b2"), "key:b")
    assert again.rewrite.checked is not None and again.rewrite.checked.seen is not None
    assert again.rewrite.stable_prefix == 4  # key b's own previous turn
    a_seen = chain.histories.get(scoped("key:a", FAMILY))
    assert a_seen is not None and again.rewrite.checked.seen is not a_seen.messages


async def test_a_memo_that_is_not_the_tip_any_more_is_not_trusted() -> None:
    """Another replica moved the branch on: the memo's history is no longer the tip."""
    state = MemoryState()
    chain = Chain([])
    here, there = Lineage(state, chain.histories), Lineage(state)
    await one_turn(here, chain, START, "key:a")
    moved = turn(START, "elsewhere")
    elsewhere = request(moved, "key:a")
    await there.resolve(elsewhere)
    assert elsewhere.identity.session_name == FAMILY
    # Back here, a request that continues the memo's history but not the tip: a new branch.
    ex = await one_turn(here, chain, turn(START, "here"), "key:a")
    assert ex.identity.session_name != FAMILY
    assert ex.rewrite.checked is not None and ex.rewrite.checked.seen is None
    assert ex.rewrite.checked.digest.value == digest(turn(START, "here"))


def test_the_memo_is_bounded_by_request_bytes() -> None:
    from proxy.sessions.history_memo import Seen

    memo = HistoryMemo(100)
    memo.remember("key:a/s1", Seen(60, list(START)))
    memo.remember("key:a/s2", Seen(60, list(START)))
    assert memo.get("key:a/s1") is None and memo.get("key:a/s2") is not None
    memo.remember("key:a/s3", Seen(101, list(START)))  # larger than the whole memo: not kept
    assert memo.get("key:a/s3") is None


async def test_a_gemini_session_serializes_only_each_turns_new_messages(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same memo under the Gemini wire: a session named by its opening (Gemini CLI sends
    no id) is hashed by its new view messages only, whatever its length."""
    hashed: list[int] = []
    real_of, real_extended, real_digest = Digest.of.__func__, Digest.extended, lineage_module.digest

    def of(cls: type[Digest], messages: list[dict[str, Any]]) -> Digest:
        hashed[-1] += len(messages)
        return real_of(cls, messages)

    def extended(self: Digest, more: list[dict[str, Any]]) -> Digest:
        hashed[-1] += len(more)
        return real_extended(self, more)

    def whole(messages: list[dict[str, Any]]) -> int:
        hashed[-1] += len(messages)
        return real_digest(messages)

    monkeypatch.setattr(Digest, "of", classmethod(of))
    monkeypatch.setattr(Digest, "extended", extended)
    monkeypatch.setattr(lineage_module, "digest", whole)
    proxy = await start(start_proxy, tmp_path, upstream)
    url = proxy.make_url("/v1beta/models/gemini-native:generateContent")
    system = {"parts": [{"text": "be brief"}]}
    contents: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        for step in range(12):
            contents.append({"role": "user", "parts": [{"text": f"step {step}"}]})
            hashed.append(0)
            body = {"systemInstruction": system, "contents": contents}
            async with http.post(url, json=body, headers={"x-goog-api-key": KEY}) as response:
                assert response.status == 200, await response.text()
                answer = await response.json()
            contents.append(answer["candidates"][0]["content"])
    # the first turn hashes its system message and question; each later one its two new
    # messages (the answer, the question), never the history before them
    assert hashed == [2] * 12
