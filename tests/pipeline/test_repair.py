"""The repair stage, called directly on factory-built exchanges: each fix, its note, its text."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson

from proxy.exchange import Exchange
from proxy.messages import Message, pairing_problems
from proxy.pipeline.base import StageContext
from proxy.pipeline.repair import RepairStage, set_aside_ref
from proxy.policies.spec import Policy, RepairSpec
from proxy.recording.events import EventLog
from tests.pipeline.factories import context, exchange

USER: Message = {"role": "user", "content": "go"}
LATER: Message = {"role": "user", "content": "and then?"}
DROP = Policy(name="drop", repair=RepairSpec(orphans="drop"))


def call(*ids: str, name: str = "read_file", arguments: str = '{"path": "a.txt"}') -> Message:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": name, "arguments": arguments}}
            for i in ids
        ],
    }


def result(call_id: str, content: Any = "ok") -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def dangling(call_id: str, name: str = "read_file") -> Message:
    text = (
        f"Tool call {name} with id {call_id} did not complete - no result was recorded. "
        "It may have been cancelled or interrupted."
    )
    return result(call_id, text)


async def repair(
    messages: list[Message], policy: Policy | None = None, ctx: StageContext | None = None
) -> tuple[list[Message] | None, Exchange]:
    ex = exchange(messages, policy)
    out = await RepairStage().run(ex, messages, ctx or context())
    assert out is None or pairing_problems(out) == []
    return out, ex


def notes(ex: Exchange) -> list[tuple[str, dict[str, Any]]]:
    """The fixes recorded (archiving of what they took out is checked on its own)."""
    assert all(n.stage == "repair" for n in ex.notes)
    return [(n.action, n.fields) for n in ex.notes if n.action != "archived"]


async def test_a_valid_history_needs_nothing() -> None:
    history = [
        {"role": "system", "content": "be brief"},
        USER,
        call("a", "b"),
        result("b"),  # parallel results may come in any order
        result("a"),
        {"role": "assistant", "content": "done"},
        LATER,
        call("c", arguments=""),  # no-parameter tools send empty arguments
        result("c"),
    ]
    out, ex = await repair(history)
    assert out is None and ex.notes == []


async def test_ids_reused_across_turns_pair_up_turn_by_turn() -> None:
    out, _ = await repair([USER, call("call_0"), result("call_0"), LATER, call("call_0")])
    assert out == [
        USER,
        call("call_0"),
        result("call_0"),
        LATER,
        call("call_0"),
        dangling("call_0"),
    ]


async def test_a_dangling_call_gets_a_synthetic_result_after_the_real_ones() -> None:
    out, ex = await repair([USER, call("a", "b", "c"), result("b"), LATER])
    assert out == [USER, call("a", "b", "c"), result("b"), dangling("a"), dangling("c"), LATER]
    # One line per kind of fix, with a count and the ids, however many calls it touched.
    assert notes(ex) == [("patched_dangling", {"count": 2, "tool_call_ids": ["a", "c"]})]


async def test_a_dangling_call_at_the_end_and_its_answer_on_the_next_turn() -> None:
    turn = [USER, call("a", name="search")]
    first, _ = await repair(turn)
    assert first == [*turn, dangling("a", name="search")]
    # The real result arrives later: it takes the synthetic one's place (the one change an
    # appended message may make to an earlier part of the output).
    second, ex = await repair([*turn, LATER, result("a", "found")])
    assert second == [*turn, result("a", "found"), LATER]
    assert notes(ex) == [("moved_result", {"count": 1, "tool_call_ids": ["a"]})]


async def test_a_misplaced_result_moves_back_to_its_call() -> None:
    out, ex = await repair([USER, call("a", "b"), result("a"), LATER, result("b")])
    assert out == [USER, call("a", "b"), result("a"), result("b"), LATER]
    assert notes(ex) == [("moved_result", {"count": 1, "tool_call_ids": ["b"]})]


async def test_interleaved_calls_are_untangled() -> None:
    history = [USER, call("a"), call("b"), result("b"), result("a"), LATER]
    out, ex = await repair(history)
    assert out == [USER, call("a"), result("a"), call("b"), result("b"), LATER]
    assert notes(ex) == [("moved_result", {"count": 1, "tool_call_ids": ["a"]})]


async def test_duplicate_results_keep_the_first() -> None:
    history = [call("a"), result("a", "first"), result("a", "second"), LATER, result("a", "3rd")]
    out, ex = await repair(history)
    assert out == [call("a"), result("a", "first"), LATER]
    assert notes(ex) == [("dropped_duplicate", {"count": 2, "tool_call_ids": ["a", "a"]})]


async def test_an_orphan_becomes_a_note_in_its_place() -> None:
    payload = "x" * 600
    out, ex = await repair([USER, result("z", payload), LATER])
    ref = set_aside_ref("s1", result("z", payload))
    note = (
        "[agentproxy] A tool result arrived for call z (600 chars) without a matching tool "
        f"call, so it was set aside (archived as {ref}): {'x' * 500}"
    )
    assert out == [USER, {"role": "user", "content": note}, LATER]
    assert notes(ex) == [("noted_orphan", {"count": 1, "tool_call_ids": ["z"]})]
    assert (ex.notes[-1].action, ex.notes[-1].fields) == ("archived", {"count": 1, "refs": [ref]})


async def test_an_orphan_is_dropped_when_the_policy_says_so() -> None:
    out, ex = await repair([USER, result("z"), LATER], DROP)
    assert out == [USER, LATER]
    assert notes(ex) == [("dropped_orphan", {"count": 1, "tool_call_ids": ["z"]})]


async def test_orphans_inside_a_call_block_and_in_a_row_stay_valid_and_ordered() -> None:
    history = [call("a", "b"), result("a"), result("y"), result("b"), result("z"), LATER]
    out, ex = await repair(history)
    assert out is not None
    assert out[:3] == [call("a", "b"), result("a"), result("b")]
    # Two consecutive notes are two plain user messages: valid, in the orphans' order.
    assert [m["role"] for m in out[3:]] == ["user", "user", "user"]
    assert "call y " in out[3]["content"] and "call z " in out[4]["content"]
    assert notes(ex) == [("noted_orphan", {"count": 2, "tool_call_ids": ["y", "z"]})]


async def test_a_result_before_its_call_is_an_orphan_and_the_call_dangles() -> None:
    out, _ = await repair([USER, result("a"), call("a")], DROP)
    assert out == [USER, call("a"), dangling("a")]


async def test_results_without_a_usable_id_are_orphans() -> None:
    out, _ = await repair([call("a"), result("a"), {"role": "tool", "content": "?"}], DROP)
    assert out == [call("a"), result("a")]


async def test_malformed_arguments_are_reported_in_the_result() -> None:
    broken = '{"path": "a.txt", "content": "' + "y" * 300
    prefix = (
        "[agentproxy] The arguments of this call were not valid JSON, so the tool probably did "
        f"not run as intended: {broken[:200]}\n"
    )
    parts = [{"type": "text", "text": "listed"}]
    history = [
        call("a", name="write_file", arguments=broken),
        result("a", "written"),
        call("b", "c", arguments="{oops"),
        result("b", parts),
    ]
    out, ex = await repair(history)
    assert out is not None
    assert out[1] == result("a", prefix + "written")
    assert out[3]["content"] == [
        {"type": "text", "text": prefix.replace(broken[:200], "{oops")},
        *parts,
    ]
    assert out[4]["content"].startswith("[agentproxy] The arguments of this call")
    assert out[4]["content"].endswith(dangling("c")["content"])
    assert notes(ex) == [
        ("patched_dangling", {"count": 1, "tool_call_ids": ["c"]}),
        ("flagged_bad_arguments", {"count": 3, "tool_call_ids": ["a", "b", "c"]}),
    ]


def custom(call_id: str, text: str, name: str = "apply_patch") -> Message:
    """A custom tool's call, as chat has it (and the Responses view shows Codex's)."""
    call = {"id": call_id, "type": "custom", "custom": {"name": name, "input": text}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


async def test_a_custom_tools_free_text_is_never_flagged_as_json() -> None:
    script = "const r = await tools.exec_command({cmd: 'ls'});\ntext(r.output);"
    history = [USER, custom("p", "*** Begin Patch\n*** End Patch"), result("p")]
    history += [custom("x", script, name="exec"), result("x"), LATER]
    out, ex = await repair(history)
    assert out is None and notes(ex) == []  # nothing to do: the clean pass says so
    dangling_one = [USER, custom("x", script, name="exec"), LATER]
    out, ex = await repair(dangling_one)
    assert out is not None and out[2] == dangling("x", name="exec")
    assert notes(ex) == [("patched_dangling", {"count": 1, "tool_call_ids": ["x"]})]


async def test_the_input_is_never_mutated_and_unchanged_dicts_are_reused() -> None:
    history = [USER, call("a", "b", arguments="{"), result("a"), LATER, result("z"), result("b")]
    before = copy.deepcopy(history)
    out, _ = await repair(history)
    assert history == before
    assert out is not None and out[0] is history[0] and out[4] is history[3]


async def test_the_same_input_gives_the_same_bytes() -> None:
    history = [USER, call("a", "b", arguments="{"), result("z"), LATER, result("b"), call("c")]
    outputs = [orjson.dumps((await repair(copy.deepcopy(history)))[0]) for _ in range(3)]
    assert len(set(outputs)) == 1


async def test_fixes_are_counted_and_logged_once_per_kind(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    ctx = context(events=EventLog(str(log)))
    await repair([USER, result("z"), call("a", "b"), LATER], ctx=ctx)
    registry = ctx.metrics.registry
    for action, count in (("patched_dangling", 1.0), ("noted_orphan", 1.0)):
        labels = {"stage": "repair", "action": action}
        assert registry.get_sample_value("agentproxy_rewrites_total", labels) == count
    ctx.events.flush()
    events = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert [(e["action"], e["count"], e.get("tool_call_ids")) for e in events] == [
        ("patched_dangling", 2, ["a", "b"]),
        ("noted_orphan", 1, ["z"]),
        ("archived", 1, None),
    ]
    assert events[-1]["refs"][0].startswith("ap_")


def test_the_policy_switches_it_off() -> None:
    assert RepairStage().enabled(Policy(name="on"))
    assert not RepairStage().enabled(Policy(name="off", repair=RepairSpec(enabled=False)))


async def test_what_repair_takes_out_is_archived_first() -> None:
    """Recoverable law: orphans and duplicate answers leave the history, not the archive."""
    ctx = context()
    history = [
        USER,
        result("z", "orphan body"),
        call("a"),
        result("a", "first"),
        result("a", "2nd"),
    ]
    out, ex = await repair(history, ctx=ctx)
    assert out is not None
    (archived,) = [n.fields for n in ex.notes if n.action == "archived"]
    assert archived["count"] == 2
    stored = [await ctx.store.get(ref) for ref in archived["refs"]]
    contents = sorted(orjson.loads(data)["content"] for _, data in filter(None, stored))
    assert contents == ["2nd", "orphan body"]
