"""Loop detection, called directly on factory-built exchanges."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.messages import Message, is_valid_pairing
from proxy.pipeline.base import StageContext
from proxy.pipeline.chain import Chain
from proxy.pipeline.loops import LoopDetected, LoopStage, call_hash
from proxy.pipeline.repair import RepairStage
from proxy.policies.spec import LoopAction, LoopSpec, Policy
from tests.pipeline.factories import context, exchange

READ = ("read_file", '{"path": "a.txt"}')
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]


def agent(*calls: tuple[str, str], prefix: str = "c") -> list[Message]:
    """A history where the agent made `calls`, one per turn, each answered the same way."""
    history: list[Message] = [{"role": "user", "content": "fix the build"}]
    for i, (name, arguments) in enumerate(calls):
        call_id = f"{prefix}{i}"
        function = {"name": name, "arguments": arguments}
        history.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        history.append({"role": "tool", "tool_call_id": call_id, "content": "no such file"})
    return history


def policy(
    *, mode: str = "enforce", ladder: tuple[LoopAction, ...] | None = None, **loops: Any
) -> Policy:
    spec = LoopSpec(**loops) if ladder is None else LoopSpec(ladder=ladder, **loops)
    return Policy(name="test", mode=mode, loops=spec)  # type: ignore[arg-type]


async def step(
    stage: LoopStage,
    history: list[Message],
    ctx: StageContext | None = None,
    *,
    session: str = "s1",
    loops: Policy | None = None,
    **body: Any,
) -> tuple[list[Message] | None, Any]:
    ex = exchange(history, loops or policy(), session=session, tools=TOOLS, **body)
    result = await stage.run(ex, history, ctx or context())
    return result, ex


def actions(ex: Any) -> list[str]:
    return [note.action for note in ex.notes if note.stage == "loops"]


def test_hash_ignores_key_order_and_spacing_but_not_values_or_names() -> None:
    assert call_hash("read", '{"a": 1, "b": {"x": 1, "y": 2}}') == call_hash(
        "read", '{"b":{"y":2,"x":1},"a":1}'
    )
    assert call_hash("read", '{"a": 1}') != call_hash("read", '{"a": 2}')
    assert call_hash("read", '{"a": 1}') != call_hash("write", '{"a": 1}')
    # Unparseable arguments hash as written; empty ones as {}.
    assert call_hash("read", "{oops") == call_hash("read", "{oops")
    assert call_hash("read", "{oops") != call_hash("read", "{oops ")
    assert call_hash("read", "") == call_hash("read", "{}")


async def test_below_the_threshold_nothing_happens() -> None:
    result, ex = await step(LoopStage(), agent(READ, READ))
    assert result is None and ex.notes == []


async def test_third_identical_call_warns_with_a_note_naming_the_call() -> None:
    history = agent(READ, READ, READ)
    result, ex = await step(LoopStage(), history)
    assert result is not None and result[:-1] == history
    assert result[-1] == {
        "role": "user",
        "content": "[agentproxy] You have called read_file with the same arguments 3 times in "
        'your last 3 calls ({"path": "a.txt"}); its result will not change. Try something '
        "different or explain what is blocking you.",
    }
    assert is_valid_pairing(result)
    assert "tool_choice" not in ex.body
    [note] = ex.notes
    assert (note.stage, note.action) == ("loops", "warn")
    assert note.fields["tool"] == "read_file" and note.fields["repeats"] == 3
    assert note.fields["window"] == 3 and note.fields["level"] == 1
    assert note.fields["kind"] == "repeat"
    assert note.fields["hash"] == f"{call_hash(*READ):016x}"


async def test_key_order_does_not_hide_a_repeat() -> None:
    history = agent(
        ("grep", '{"pattern": "TODO", "path": "src"}'),
        ("grep", '{"path":"src","pattern":"TODO"}'),
        ("grep", '{\n  "path": "src",\n  "pattern": "TODO"\n}'),
    )
    _, ex = await step(LoopStage(), history)
    assert actions(ex) == ["warn"]


async def test_repeats_count_only_within_the_window() -> None:
    varied = [("read_file", f'{{"path": "{i}.txt"}}') for i in range(3)]
    # Three identical calls, but only two of them within the last five.
    _, ex = await step(LoopStage(), agent(READ, *varied, READ, READ))
    assert actions(ex) == []
    _, ex = await step(LoopStage(), agent(READ, varied[0], READ, varied[1], READ))
    assert actions(ex) == ["warn"]
    assert ex.notes[0].fields["repeats"] == 3 and ex.notes[0].fields["window"] == 5


async def test_the_newest_call_must_be_the_repeated_one() -> None:
    """An agent that repeated itself and then moved on is not stuck."""
    _, ex = await step(LoopStage(), agent(READ, READ, READ, ("run_tests", "{}")))
    assert actions(ex) == []


async def test_varied_calls_never_trigger() -> None:
    stage, ctx = LoopStage(), context()
    calls = [("read_file", f'{{"path": "src/m{i}.py"}}') for i in range(60)]
    calls += [("write_file", f'{{"path": "src/m{i}.py", "text": "x"}}') for i in range(60)]
    for turn in range(1, len(calls) + 1):
        _, ex = await step(stage, agent(*calls[:turn]), ctx)
        assert ex.notes == []


async def test_allowed_tools_are_never_counted() -> None:
    poll = ("job_status", '{"job": 7}')
    stage = LoopStage()
    _, ex = await step(stage, agent(*[poll] * 8), loops=policy(allow=("job_status",)))
    assert actions(ex) == []
    # Polls in between do not make a repeated call look different, nor fill the window.
    history = agent(READ, poll, poll, READ, poll, poll, poll, READ)
    _, ex = await step(stage, history, loops=policy(allow=("job_status",)))
    assert actions(ex) == ["warn"] and ex.notes[0].fields["tool"] == "read_file"


async def test_an_a_b_a_b_cycle_is_detected_and_keeps_its_identity_as_it_turns() -> None:
    other = ("run_tests", '{"target": "unit"}')
    stage, ctx = LoopStage(), context()
    _, ex = await step(stage, agent(READ, other, READ), ctx)
    assert actions(ex) == []
    result, ex = await step(stage, agent(READ, other, READ, other), ctx)
    assert actions(ex) == ["warn"]
    fields = ex.notes[0].fields
    assert fields["kind"] == "cycle" and fields["tool"] == "read_file→run_tests"
    assert fields["repeats"] == 2 and fields["window"] == 4
    assert result is not None
    assert result[-1]["content"] == (
        "[agentproxy] You have repeated the same 2 calls in a cycle 2 times in your last 4 "
        'calls (read_file {"path": "a.txt"} → run_tests {"target": "unit"}); their results '
        "will not change. Try something different or explain what is blocking you."
    )
    cycle = fields["hash"]
    _, ex = await step(stage, agent(READ, other, READ, other, READ), ctx)
    assert actions(ex) == ["no_tools"] and ex.notes[0].fields["hash"] == cycle


async def test_a_period_three_cycle_is_detected() -> None:
    a, b, c = (("step", f'{{"n": {i}}}') for i in range(3))
    _, ex = await step(LoopStage(), agent(a, b, c, a, b))
    assert actions(ex) == []
    _, ex = await step(LoopStage(), agent(a, b, c, a, b, c))
    assert actions(ex) == ["warn"] and ex.notes[0].fields["tool"] == "step→step→step"


async def test_the_ladder_climbs_one_step_per_repeated_call() -> None:
    stage, ctx = LoopStage(), context()
    result, ex = await step(stage, agent(*[READ] * 3), ctx)
    assert actions(ex) == ["warn"] and result is not None
    assert "tool_choice" not in ex.body

    result, ex = await step(stage, agent(*[READ] * 4), ctx)
    assert actions(ex) == ["no_tools"] and ex.notes[0].fields["level"] == 2
    assert ex.body["tool_choice"] == "none"
    assert result is not None and result[-1]["role"] == "user"
    assert result[-1]["content"].endswith("Tools are disabled for this reply: answer in words.")

    # The model answered in words and the user said go on: no step happened, the level stays.
    words = [
        *agent(*[READ] * 4),
        {"role": "assistant", "content": "I keep getting 'no such file'."},
        {"role": "user", "content": "keep going"},
    ]
    result, ex = await step(stage, words, ctx)
    assert result is None and ex.notes == []

    with pytest.raises(LoopDetected) as raised:
        await step(stage, agent(*[READ] * 5), ctx)
    error = raised.value
    assert error.status == 429 and error.headers == {"x-should-retry": "false"}
    assert error.message.startswith(
        "loop detected: read_file was called with the same arguments 5 times in the last 5 "
        'calls ({"path": "a.txt"}); the result will not change. Detection 3 of this loop'
    )
    body = orjson.loads(orjson.dumps(error.body("req-9")))
    assert body["error"]["type"] == "loop_detected" and body["error"]["code"] == "loop_detected"
    assert body["error"]["request_id"] == "req-9"
    loop = body["error"]["loop"]
    assert loop["tool"] == "read_file" and loop["repeats"] == 5 and loop["window"] == 5
    assert loop["level"] == 3 and loop["hash"] == f"{call_hash(*READ):016x}"
    assert loop["calls"] == [{"name": "read_file", "arguments": '{"path": "a.txt"}'}]

    # Later steps stay blocked: the ladder's last rung holds.
    with pytest.raises(LoopDetected):
        await step(stage, agent(*[READ] * 6), ctx)


async def test_a_resent_history_repeats_the_decision_instead_of_climbing() -> None:
    stage, ctx = LoopStage(), context()
    history = agent(*[READ] * 3)
    for _ in range(3):  # a client retrying the same request
        _, ex = await step(stage, history, ctx)
        assert actions(ex) == ["warn"]
    _, ex = await step(stage, agent(*[READ] * 4), ctx)
    assert actions(ex) == ["no_tools"]


async def test_a_session_that_stops_repeating_starts_the_ladder_again() -> None:
    stage, ctx = LoopStage(), context()
    other = ("run_tests", "{}")
    await step(stage, agent(*[READ] * 3), ctx)
    _, ex = await step(stage, agent(*[READ] * 4), ctx)
    assert actions(ex) == ["no_tools"]
    _, ex = await step(stage, agent(*[READ] * 4, other), ctx)
    assert actions(ex) == ["recovered"] and ex.notes[0].fields["level"] == 2
    _, ex = await step(stage, agent(*[READ] * 4, other, READ), ctx)
    assert actions(ex) == ["warn"] and ex.notes[0].fields["level"] == 1


async def test_a_different_loop_starts_the_ladder_again() -> None:
    stage, ctx = LoopStage(), context()
    other = ("run_tests", "{}")
    _, ex = await step(stage, agent(READ, other, READ, other), ctx)
    assert actions(ex) == ["warn"] and ex.notes[0].fields["kind"] == "cycle"
    _, ex = await step(stage, agent(READ, other, READ, other, READ), ctx)
    assert actions(ex) == ["no_tools"]
    # Stuck on READ alone now (three of the last five): another loop, so warned first.
    _, ex = await step(stage, agent(READ, other, READ, other, READ, READ), ctx)
    assert actions(ex) == ["warn"] and ex.notes[0].fields["kind"] == "repeat"


async def test_sessions_climb_their_own_ladders() -> None:
    stage, ctx = LoopStage(), context()
    await step(stage, agent(*[READ] * 3), ctx, session="a")
    _, ex = await step(stage, agent(*[READ] * 4), ctx, session="a")
    assert actions(ex) == ["no_tools"]
    _, ex = await step(stage, agent(*[READ] * 4, prefix="d"), ctx, session="b")
    assert actions(ex) == ["warn"]
    with pytest.raises(LoopDetected):
        await step(stage, agent(*[READ] * 5), ctx, session="a")
    _, ex = await step(stage, agent(*[READ] * 5, prefix="d"), ctx, session="b")
    assert actions(ex) == ["no_tools"]


async def test_dry_run_detects_and_climbs_but_never_modifies_nor_blocks() -> None:
    stage, ctx = LoopStage(), context()
    watch = policy(mode="dry_run")
    seen = []
    for n in range(3, 8):
        history = agent(*[READ] * n)
        ex = exchange(history, watch, tools=TOOLS)
        await Chain([stage, RepairStage()]).rewrite(ex, ctx)
        assert ex.body["messages"] is history and "tool_choice" not in ex.body
        seen += actions(ex)
    assert seen == ["warn", "no_tools", "block", "block", "block"]


async def test_no_tools_leaves_a_request_without_tools_alone() -> None:
    stage = LoopStage()
    history = agent(*[READ] * 3)
    ex = exchange(history, policy(ladder=("no_tools",)))
    result = await stage.run(ex, history, context())
    assert result is not None and "tool_choice" not in ex.body


async def test_a_block_passes_through_the_chain_as_a_refusal() -> None:
    history = agent(*[READ] * 3)
    ex = exchange(history, policy(ladder=("block",)), tools=TOOLS)
    with pytest.raises(LoopDetected):
        await Chain([LoopStage(), RepairStage()]).rewrite(ex, context())
    assert [(n.stage, n.action) for n in ex.notes] == [("loops", "block")]


async def test_the_note_leaves_a_valid_history_the_chain_keeps() -> None:
    history = agent(*[READ] * 3)
    ex = exchange(history, policy(), tools=TOOLS)
    sent = await Chain([LoopStage(), RepairStage()]).rewrite(ex, context())
    assert len(sent) == len(history) + 1 and ex.body["messages"] is sent
    assert [(n.stage, n.action) for n in ex.notes] == [("loops", "warn")]


async def test_only_a_step_is_judged() -> None:
    """No call in the model's last message: nothing just repeated, so nothing is decided."""
    history = [*agent(*[READ] * 3), {"role": "assistant", "content": "done"}]
    result, ex = await step(LoopStage(), history)
    assert result is None and ex.notes == []
    result, ex = await step(LoopStage(), [{"role": "user", "content": "hi"}])
    assert result is None and ex.notes == []


async def test_parallel_calls_in_one_message_count_each() -> None:
    calls = [
        {"id": f"p{i}", "type": "function", "function": {"name": READ[0], "arguments": READ[1]}}
        for i in range(3)
    ]
    history: list[Message] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": f"p{i}", "content": "x"} for i in range(3)),
    ]
    _, ex = await step(LoopStage(), history)
    assert actions(ex) == ["warn"]


async def test_only_the_tail_of_a_long_history_is_read() -> None:
    """Identical calls far back, before many messages without calls, are not looked at."""
    history = agent(*[READ] * 2)
    history += [{"role": "user", "content": f"note {i}"} for i in range(40)]
    history += agent(READ, prefix="z")[1:]
    _, ex = await step(LoopStage(), history)
    assert actions(ex) == []


async def test_malformed_calls_are_skipped_not_fatal() -> None:
    history: list[Message] = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "x"}, "junk", {"function": 1}],
        },
        {"role": "tool", "tool_call_id": "x", "content": "?"},
    ]
    result, ex = await step(LoopStage(), history)
    assert result is None and ex.notes == []
    weird = agent(*[("read_file", "{not json")] * 3)
    _, ex = await step(LoopStage(), weird)
    assert actions(ex) == ["warn"]


# --- the calls of a session's last turn, taken instead of read again ---------------------------


def counting_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The indexes of the messages whose calls were read (loops._call), in order."""
    from proxy.pipeline import loops

    read: list[int] = []
    real = loops._call

    def counted(raw: Any, index: int) -> Any:
        read.append(index)
        return real(raw, index)

    monkeypatch.setattr(loops, "_call", counted)
    return read


async def turn_through(chain: Chain, history: list[Message], session: str) -> Any:
    ex = exchange(history, policy(), session=session, tools=TOOLS)
    await chain.rewrite(ex, context())
    return ex


async def test_a_turn_reads_only_the_calls_its_session_has_not_sent_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stage = LoopStage()
    chain = Chain([stage])
    calls = [("read_file", f'{{"path": "m{i}.py"}}') for i in range(8)]
    await turn_through(chain, agent(*calls[:5]), "key:a/s1")
    read = counting_calls(monkeypatch)
    await turn_through(chain, agent(*calls[:6]), "key:a/s1")
    assert read == [11]  # the new assistant message only
    read.clear()
    await turn_through(chain, agent(*calls[:6]), "key:a/s1")  # a retry: nothing new
    assert read == []
    # Another key with the same session id reads every call itself: tenants are walls.
    read.clear()
    await turn_through(chain, agent(*calls[:6]), "key:b/s1")
    assert read == [11, 9, 7, 5, 3, 1]


async def test_calls_taken_from_the_last_turn_decide_exactly_as_calls_read_afresh() -> None:
    """A repeated call, a cycle and varied calls, growing turn by turn: the remembering stage
    and a fresh one (nothing remembered) note the same every turn."""
    other = ("run_tests", '{"target": "unit"}')
    script = [READ, other, READ, other, ("x", "{}"), READ, READ, READ, other, READ, READ]
    kept = Chain([LoopStage()])
    for turn in range(1, len(script) + 1):
        history = agent(*script[:turn])
        remembered = await turn_through(kept, history, "s1")
        fresh = await turn_through(Chain([LoopStage()]), history, "s1")
        assert remembered.rewrite.stable_prefix > 0 or turn == 1
        assert [n.fields for n in remembered.notes] == [n.fields for n in fresh.notes], turn


async def test_calls_are_not_taken_when_an_earlier_stage_rewrote_the_history(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Rewrites:
        name = "rewrites"
        preserves_pairing = True

        def enabled(self, policy: Policy) -> bool:
            return True

        async def run(self, ex: Any, messages: list[Message], ctx: Any) -> list[Message]:
            return list(messages)  # another list: indexes may no longer be the client's

    chain = Chain([Rewrites(), LoopStage()])
    await turn_through(chain, agent(READ, READ), "s1")
    read = counting_calls(monkeypatch)
    await turn_through(chain, agent(READ, READ, READ), "s1")
    assert read == [5, 3, 1]
