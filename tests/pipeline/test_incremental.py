"""Warm turns redo work only past the part of the history the session already sent — and
still get every answer right when that part changes."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

from proxy.messages import Message, pairing_problems
from proxy.pipeline.base import Stage, StageContext
from proxy.pipeline.chain import Chain
from proxy.pipeline.compaction.stage import CompactionStage
from proxy.pipeline.loops import LoopStage
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
    assert ex.rewrite.stable_prefix == 0
    ex, _ = await turn(chain, ctx, [*history, user("b")])
    assert ex.rewrite.stable_prefix == 3
    edited = [user("changed"), *history[1:], user("b")]
    ex, _ = await turn(chain, ctx, edited)
    assert ex.rewrite.stable_prefix == 0


async def test_problems_in_the_new_messages_are_still_repaired() -> None:
    history = [user("a"), call("c1"), result("c1")]
    for broken in ([call("c2"), user("b")], [result("stray")], [result("c1")]):
        chain, ctx = Chain([RepairStage(), OffloadStage()]), context()
        await turn(chain, ctx, history)
        ex, sent = await turn(chain, ctx, [*history, *broken])
        assert ex.rewrite.stable_prefix == 3
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
    small.client.body_bytes = 500
    await chain.rewrite(small, ctx)
    huge = exchange(copy.deepcopy(history), policy=POLICY, session="huge")
    huge.client.body_bytes = 50_000  # over the whole memo: not kept
    await chain.rewrite(huge, ctx)
    again = exchange(copy.deepcopy([*history, user("b")]), policy=POLICY, session="huge")
    again.client.body_bytes = 50_000
    await chain.rewrite(again, ctx)
    assert again.rewrite.stable_prefix == 0


def test_long_arguments_are_not_cached() -> None:
    from proxy.pipeline import repair

    before = len(repair._parsed)
    assert repair._parses('{"content": "' + "x" * 10_000 + '"}')
    assert len(repair._parsed) == before


class Park:
    """A stage that holds the request whose history is `held` until `release` is set: any
    stage may await (a store write, a tokenizer), and the session's next request goes on."""

    name = "park"

    def __init__(self) -> None:
        self.held: list[Message] | None = None
        self.parked = asyncio.Event()
        self.release = asyncio.Event()

    def enabled(self, policy: Policy) -> bool:
        return True

    async def run(self, ex: Any, messages: list[Message], ctx: StageContext) -> None:
        if messages == self.held:
            self.parked.set()
            await self.release.wait()


async def race(
    stages: Callable[[], list[Stage]],
    before: list[Message],
    edited: list[Message],
    more: list[Message],
) -> tuple[Any, Any]:
    """`before`, then at once an edit of it (A, parked before every stage) and B = A's history
    plus `more`: B's exchange and what it was sent, and the same for B alone on a fresh chain."""
    park = Park()
    chain, ctx = Chain([park, *stages()]), context()
    await turn(chain, ctx, before)
    park.held = edited
    parked = asyncio.create_task(turn(chain, ctx, edited))
    await park.parked.wait()
    raced = await turn(chain, ctx, [*edited, *more])
    park.release.set()
    await parked
    return raced, await turn(Chain(stages()), context(), [*edited, *more])


def call_to(call_id: str, path: str) -> Message:
    message = call(call_id)
    message["tool_calls"][0]["function"]["arguments"] = json.dumps({"path": path})
    return message


async def test_an_edit_racing_the_next_turn_leaves_offloads_exact() -> None:
    """Two requests of one session at once: A edits old messages and is parked before its
    stages ran; B continues A's history. No stage may reuse what it memoised for the turn
    before A, whose history A's edit no longer matches."""
    before = [user("go"), call("c1"), result("c1", 5000)]
    edited = [user("go"), call("c1"), {**result("c1"), "content": "x" * 5000}]
    (_, sent), (_, alone) = await race(
        lambda: [RepairStage(), OffloadStage()], before, edited, [user("b")]
    )
    assert sent == alone


async def test_an_edit_racing_the_next_turn_leaves_loop_detection_exact() -> None:
    before = [user("go"), call_to("c1", "a"), result("c1"), call_to("c2", "a"), result("c2")]
    edited = [user("go"), call_to("c1", "b"), result("c1"), call_to("c2", "c"), result("c2")]
    step = [call_to("c3", "a"), result("c3")]
    (_, sent), (_, alone) = await race(lambda: [LoopStage()], before, edited, step)
    assert sent == alone  # b, c, a: no loop (the turn before A read a, a: a, a, a would be)


async def test_an_edit_racing_the_next_turn_is_still_repaired() -> None:
    before = [user("go"), call("c1"), result("c1")]
    edited = [user("go"), call("c1"), user("b")]  # c1's result replaced: c1 now dangles
    (_, sent), (_, alone) = await race(lambda: [RepairStage()], before, edited, [user("c")])
    assert pairing_problems(sent) == []
    assert sent == alone


async def test_an_edit_racing_the_next_turn_is_measured_exactly() -> None:
    before = [user("go"), call("c1"), result("c1", 5000)]
    edited = [user("go"), call("c1"), result("c1", 10)]
    (raced, _), (alone, _) = await race(lambda: [CompactionStage()], before, edited, [user("b")])
    assert raced.prompt.estimate == alone.prompt.estimate


async def test_the_turn_a_memo_names_holds_nothing() -> None:
    """Stage memos keep the turn they were computed on: a bare token, or every old history
    would stay alive in them, uncounted by their byte bounds (a soak grew 70 MB a minute)."""
    chain, ctx = Chain([RepairStage(), OffloadStage(), LoopStage()]), context()
    history = [user("a"), call("c1"), result("c1", 5000)]
    first, _ = await turn(chain, ctx, history)
    second, _ = await turn(chain, ctx, [*history, user("b")])
    assert second.rewrite.stable_base is first.rewrite.turn
    assert type(first.rewrite.turn) is object and type(second.rewrite.turn) is object
