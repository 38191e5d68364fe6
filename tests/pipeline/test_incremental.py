"""Warm turns redo work only past the part of the history the session already sent — and
still get every answer right when that part changes."""

from __future__ import annotations

import copy
from typing import Any

from proxy.messages import Message, pairing_problems
from proxy.pipeline.base import StageContext
from proxy.pipeline.chain import Chain
from proxy.pipeline.offload import OffloadStage
from proxy.pipeline.repair import RepairStage
from proxy.policies.spec import OffloadSpec, Policy
from tests.pipeline.factories import context, exchange

POLICY = Policy(name="p", offload=OffloadSpec(min_tokens=200))


def call(call_id: str) -> Message:
    function = {"name": "read_file", "arguments": '{"path": "a"}'}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def result(call_id: str, size: int = 10) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": "r" * size}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


async def turn(chain: Chain, ctx: StageContext, messages: list[Message]) -> tuple[Any, Any]:
    """One request as the client sends it: a fresh parse of the whole history."""
    ex = exchange(copy.deepcopy(messages), policy=POLICY)
    sent = await chain.rewrite(ex, ctx)
    return ex, sent


async def test_stable_prefix_counts_the_messages_seen_last_turn() -> None:
    chain, ctx = Chain([RepairStage(), OffloadStage()]), context()
    history = [user("a"), call("c1"), result("c1")]
    ex, _ = await turn(chain, ctx, history)
    assert ex.stable_prefix == 0
    ex, _ = await turn(chain, ctx, [*history, user("b")])
    assert ex.stable_prefix == 3
    edited = [user("changed"), *history[1:], user("b")]
    ex, _ = await turn(chain, ctx, edited)
    assert ex.stable_prefix == 0


async def test_problems_in_the_new_messages_are_still_repaired() -> None:
    history = [user("a"), call("c1"), result("c1")]
    for broken in ([call("c2"), user("b")], [result("stray")], [result("c1")]):
        chain, ctx = Chain([RepairStage(), OffloadStage()]), context()
        await turn(chain, ctx, history)
        ex, sent = await turn(chain, ctx, [*history, *broken])
        assert ex.stable_prefix == 3
        assert pairing_problems(sent) == []
        assert ex.notes and ex.notes[0].stage == "repair"


async def test_offloads_carry_over_and_new_ones_add_up() -> None:
    chain, ctx = Chain([RepairStage(), OffloadStage()]), context()
    history = [user("a"), call("c1"), result("c1", 5000)]
    _, first = await turn(chain, ctx, history)
    history += [user("b"), call("c2"), result("c2", 10)]
    ex, second = await turn(chain, ctx, history)
    assert second[:3] == first
    assert ex.notes[-1].fields["count"] == 1
    history += [call("c3"), result("c3", 6000)]
    ex, third = await turn(chain, ctx, history)
    assert third[:6] == second
    assert ex.notes[-1].fields["count"] == 2
    assert third[7]["content"].startswith("[agentproxy] This tool result was offloaded")
    # The same history from a fresh process gives the same bytes.
    _, cold = await turn(Chain([RepairStage(), OffloadStage()]), ctx, history)
    assert cold == third


async def test_a_repaired_turn_does_not_poison_the_next() -> None:
    chain, ctx = Chain([RepairStage(), OffloadStage()]), context()
    history = [user("a"), call("c1"), user("b"), result("c1", 5000)]  # misplaced result
    _, repaired = await turn(chain, ctx, history)
    assert pairing_problems(repaired) == []
    fixed = [user("a"), call("c1"), result("c1", 5000), user("b")]
    _, sent = await turn(chain, ctx, [*fixed, user("c")])
    assert pairing_problems(sent) == []
    _, cold = await turn(Chain([RepairStage(), OffloadStage()]), context(), [*fixed, user("c")])
    assert sent == cold


async def test_offload_keeps_every_role_and_id_in_place() -> None:
    """OffloadStage declares preserves_pairing, so the chain skips its pairing check: prove it."""
    import random

    rng = random.Random(7)
    for _ in range(50):
        history: list[Message] = [user("start")]
        for i in range(rng.randint(1, 12)):
            history += [call(f"c{i}"), result(f"c{i}", rng.choice([10, 900, 5000]))]
            if rng.random() < 0.3:
                history.append(user(f"u{i}"))
        ex = exchange(copy.deepcopy(history), policy=POLICY)
        out = await OffloadStage().run(ex, ex.messages, context()) or ex.messages
        outline = [(m.get("role"), m.get("tool_call_id"), m.get("tool_calls")) for m in out]
        assert outline == [
            (m.get("role"), m.get("tool_call_id"), m.get("tool_calls")) for m in history
        ]


async def test_memory_held_for_warm_turns_is_bounded_by_bytes() -> None:
    chain, ctx = Chain([RepairStage()], memo_bytes=10_000), context()
    history = [user("a"), call("c1"), result("c1")]
    small = exchange(copy.deepcopy(history), policy=POLICY, session="small")
    small.body_bytes = 500
    await chain.rewrite(small, ctx)
    huge = exchange(copy.deepcopy(history), policy=POLICY, session="huge")
    huge.body_bytes = 50_000  # over the whole memo: not kept
    await chain.rewrite(huge, ctx)
    again = exchange(copy.deepcopy([*history, user("b")]), policy=POLICY, session="huge")
    again.body_bytes = 50_000
    await chain.rewrite(again, ctx)
    assert again.stable_prefix == 0


def test_long_arguments_are_not_cached() -> None:
    from proxy.pipeline import repair

    before = repair._parses_cached.cache_info().currsize
    assert repair._parses('{"content": "' + "x" * 10_000 + '"}')
    assert repair._parses_cached.cache_info().currsize == before
