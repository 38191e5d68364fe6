"""Fit to the context window: truncate, summarize (checkpointed), middle-out — at stage level.

Thresholds are lowered (a 2,000-token window, short arguments) so compaction events happen
often, as LangChain does for deepagents. The summarizer is the real one, talking to the
simulated model over a loopback socket; failure cases use scripted summarize callables.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from typing import Any

import orjson
import pytest

from proxy.exchange import Exchange
from proxy.messages import Message, estimate_tokens, pairing_problems
from proxy.pipeline.base import Summarizer
from proxy.pipeline.compaction import CompactionStage, memo
from proxy.pipeline.compaction.artifacts import EMPTY
from proxy.pipeline.compaction.budget import message_tokens, tokens_of
from proxy.pipeline.compaction.summarize import ledger_room
from proxy.policies.spec import CompactionSpec, Deployment, Policy
from proxy.sim.model import summary_sections
from proxy.sim.simulator import Simulator
from proxy.store.base import BlobInfo
from proxy.store.memory import MemoryStore
from proxy.upstream.pool import Upstreams
from tests.pipeline.compaction.factories import (
    GOAL,
    SPEC,
    SYSTEM,
    TOOLS,
    WELL_FORMED,
    WINDOW,
    Scripted,
    actions,
    call,
    coding_session,
    context,
    exchange,
    is_summary_request,
    note,
    real_summarizer,
    result,
    target,
    user,
    wire,
)


class Counting:
    """Counts calls of a real summarizer."""

    def __init__(self, inner: Summarizer) -> None:
        self.inner = inner
        self.calls = 0

    async def __call__(self, ex: Exchange, messages: list[Message], room: int) -> str:
        self.calls += 1
        return await self.inner(ex, messages, room)


async def send(upstreams: Upstreams, deployment: Deployment, body: dict[str, Any]) -> Message:
    """One agent turn against the simulator; raises if it rejects the request."""
    reply = await upstreams.fast.complete(deployment, body, "req-agent")
    message: Message = reply.data["choices"][0]["message"]
    return {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}


# --- estimates and the cheap exit ---------------------------------------------------------


def test_the_fast_estimate_equals_estimate_tokens() -> None:
    samples: list[Message] = [
        user("x" * 401),
        {"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "image_url"}]},
        {"role": "user", "content": [{"type": "text", "text": "ab"}, {"text": "cdef"}]},
        {"role": "assistant", "content": None},
        {"role": "assistant", "content": "hm", "tool_calls": call("a", "f", x=1)["tool_calls"]},
        call("b", "write_file", content="y" * 999),
        result("b", ""),
    ]
    for message in samples:
        assert message_tokens(message) == estimate_tokens(message), message


async def test_under_the_trigger_nothing_happens_and_nothing_is_read() -> None:
    class NoStore(MemoryStore):
        async def get_checkpoint(self, session: str, key: str) -> bytes | None:
            raise AssertionError("the cheap exit must not touch the store")

    history = coding_session(2)
    ex = exchange(history)
    assert await CompactionStage().run(ex, history, context(Scripted(), NoStore())) is None
    assert ex.notes == []


async def test_an_unknown_window_skips_the_stage() -> None:
    history = coding_session(30)
    ex = exchange(history, deployment=target(window=None))
    assert await CompactionStage().run(ex, history, context(Scripted())) is None


async def test_reserved_output_and_tool_schemas_count() -> None:
    history = coding_session(4)  # about 900 tokens: fits 2,000 on its own
    assert await CompactionStage().run(exchange(history), history, context(Scripted())) is None
    tight = exchange(history, max_tokens=900, tools=TOOLS)  # 1,100 left, schemas ~90
    assert await CompactionStage().run(tight, history, context(Scripted())) is not None
    assert note(tight, "truncated_arguments")["tokens_before"] == tokens_of(history) + 86


async def test_a_warm_turn_estimates_only_the_new_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    estimated: list[Message] = []

    def counting(message: Message) -> int:
        estimated.append(message)
        return message_tokens(message)

    monkeypatch.setattr(memo, "message_tokens", counting)
    stage, ctx = CompactionStage(), context(Scripted())
    history = coding_session(20, content_chars=280)
    await stage.run(exchange(history), history, ctx)
    estimated.clear()
    # The next turn arrives as fresh objects (parsed again), two messages longer.
    parsed_again: list[Message] = orjson.loads(orjson.dumps(history))
    longer = [*parsed_again, {"role": "assistant", "content": "k"}, user("go")]
    ex = exchange(longer)
    await stage.run(ex, longer, ctx)
    assert estimated == longer[-2:]
    assert actions(ex) == ["checkpoint_reused"]
    # An edited history is estimated afresh, never served stale figures.
    edited = [*longer[:5], user("changed"), *longer[6:]]
    estimated.clear()
    await stage.run(exchange(edited), edited, ctx)
    assert len(estimated) == len(edited)


# --- a. truncation of old writing-tool arguments --------------------------------------------


async def test_old_arguments_are_truncated_to_valid_json_and_stored_in_full() -> None:
    history = coding_session(4, content_chars=1_800)
    store = MemoryStore()
    ex = exchange(history)
    out = await CompactionStage().run(ex, history, context(Scripted(), store))
    assert out is not None and pairing_problems(out) == []
    assert actions(ex) == ["truncated_arguments"]  # enough on its own: no summary
    calls = [m for m in out if m.get("tool_calls")]
    arguments = [orjson.loads(m["tool_calls"][0]["function"]["arguments"]) for m in calls]
    old, recent = arguments[:-1], arguments[-1]
    assert recent == orjson.loads(history[-3]["tool_calls"][0]["function"]["arguments"])
    for original_call, args in zip(history[2:-3:3], old, strict=True):
        full = orjson.loads(original_call["tool_calls"][0]["function"]["arguments"])["content"]
        head, _, marker = args["content"].partition("… [agentproxy] ")
        assert head == full[: SPEC.truncate_head_chars]
        ref = marker.split("archived as ")[1].split(" ")[0]
        stored = await store.get(ref)
        assert stored is not None and stored[1].decode() == full
        assert stored[0].kind == "tool_arguments" and stored[0].meta["argument"] == "content"
        assert args["path"].startswith("src/mod")  # short arguments untouched
    fields = note(ex, "truncated_arguments")
    assert fields["arguments"] == 3 and fields["tokens_after"] < fields["tokens_before"]


async def test_truncation_is_stable_across_turns() -> None:
    stage, ctx = CompactionStage(), context(Scripted())
    history = coding_session(4, content_chars=1_800)
    first = await stage.run(exchange(history), history, ctx)
    longer = [*history, user("and one more thing")]
    ex = exchange(longer)
    second = await stage.run(ex, longer, ctx)
    assert first is not None and second is not None
    assert wire(second)[: len(first)] == wire(first)
    assert note(ex, "truncated_arguments")["new"] == 0  # served from the cache


# --- b. summarization, archive first, checkpoints -----------------------------------------


async def test_summary_keeps_the_intent_and_the_archive_holds_the_raw_messages(
    upstreams: Upstreams, sim_target: Deployment, small_sim: Simulator
) -> None:
    history = coding_session(20, content_chars=280)
    store = MemoryStore()
    ex = exchange(history, deployment=sim_target)
    out = await CompactionStage().run(ex, history, context(real_summarizer(upstreams), store))
    assert out is not None and pairing_problems(out) == []
    assert actions(ex)[-1] == "summarized"
    assert out[0] == SYSTEM
    assert out[1] == user(GOAL)  # the intent, verbatim
    summary = out[2]["content"]
    assert out[2]["role"] == "user"
    assert summary.startswith("[agentproxy] Earlier conversation summarized (")
    assert "call agentproxy_recall with that ref to read them)." in summary.splitlines()[0]
    sections = summary_sections(summary)
    assert sections["SESSION INTENT"] == GOAL
    assert "src/mod0.py" in sections["ARTIFACTS"]
    kept = out[3:]
    assert kept == history[len(history) - len(kept) :]  # the recent part, verbatim
    assert kept[0]["role"] == "user"
    fields = note(ex, "summarized")
    archived = await store.get(fields["ref"])
    assert archived is not None and archived[0].kind == "history"
    raw = history[1 : len(history) - len(kept)]
    assert orjson.loads(archived[1]) == raw
    assert archived[0].meta == {
        "messages": len(raw), "first": 1, "last": len(raw), "tokens": tokens_of(raw),
    }  # fmt: skip
    assert fields["ref"] in summary
    assert fields["tokens_after"] <= SPEC.target * WINDOW  # headroom under the trigger
    assert sum(is_summary_request(r.body) for r in small_sim.requests) == 1


async def test_the_archive_is_written_before_the_summarizer_runs() -> None:
    store = MemoryStore()

    async def summarize(ex: Exchange, messages: list[Message], room: int) -> str:
        blobs = await store.blobs(ex.identity.session)
        assert [b.kind for b in blobs] == ["history"], "archive first"
        return WELL_FORMED

    history = coding_session(20, content_chars=280)
    ex = exchange(history)
    assert await CompactionStage().run(ex, history, context(summarize, store)) is not None
    assert actions(ex) == ["summarized"]


async def test_a_checkpoint_is_reused_byte_for_byte_even_after_a_restart() -> None:
    store, summarize = MemoryStore(), Scripted()
    history = coding_session(20, content_chars=280)
    first = await CompactionStage().run(exchange(history), history, context(summarize, store))
    assert first is not None and len(summarize.calls) == 1
    longer = [*history, {"role": "assistant", "content": "done"}, user("thanks")]
    for stage in (CompactionStage(), CompactionStage()):  # fresh processes, same store
        ex = exchange(longer)
        again = await stage.run(ex, longer, context(summarize, store))
        assert again is not None
        assert wire(again) == wire(first) + wire(longer[-2:])
        assert actions(ex) == ["checkpoint_reused"]
    assert len(summarize.calls) == 1


async def test_a_changed_prefix_does_not_reuse_the_checkpoint() -> None:
    store, summarize = MemoryStore(), Scripted()
    stage = CompactionStage()
    history = coding_session(20, content_chars=280)
    await stage.run(exchange(history), history, context(summarize, store))
    edited = [SYSTEM, user("A different goal"), *history[2:]]
    ex = exchange(edited)
    out = await stage.run(ex, edited, context(summarize, store))
    assert out is not None and "checkpoint_reused" not in actions(ex)
    assert len(summarize.calls) == 2 and "A different goal" in out[1]["content"]


async def test_the_next_compaction_summarizes_the_previous_summary_and_the_new_stretch() -> None:
    store, summarize = MemoryStore(), Scripted()
    stage = CompactionStage()
    history = coding_session(20, content_chars=280)
    first = await stage.run(exchange(history), history, context(summarize, store))
    assert first is not None
    grown = coding_session(40, content_chars=280)
    ex = exchange(grown)
    out = await stage.run(ex, grown, context(summarize, store))
    assert out is not None and pairing_problems(out) == []
    assert actions(ex) == ["checkpoint_reused", "summarized"]
    second_input = summarize.calls[1]
    assert second_input[:2] == first[1:3]  # the intent and the earlier summary open it
    old_cut = len(history) - (len(first) - 3)
    assert second_input[2:] == grown[old_cut : old_cut + len(second_input) - 2]
    assert wire(out[:2]) == wire([SYSTEM, user(GOAL)])  # the intent survives, byte for byte
    assert GOAL in out[2]["content"] and out[2]["content"] != first[2]["content"]


async def test_an_unreachable_target_does_not_cost_a_summarizer_call_every_turn() -> None:
    summarize = Scripted()
    stage, ctx = CompactionStage(), context(summarize)
    huge_system: Message = {"role": "system", "content": "rules " * 1_200}  # ~1,800 tokens
    history = [huge_system, *coding_session(20, content_chars=280)[1:]]
    for turn in range(5):
        history = [*history, {"role": "assistant", "content": f"ok {turn}"}, user("go on")]
        out = await stage.run(exchange(history), history, ctx)
        assert out is not None and out[0] is huge_system
    assert len(summarize.calls) == 1


# --- d. middle-out when the summarizer fails ----------------------------------------------


@pytest.mark.parametrize(
    "summarize",
    [Scripted(RuntimeError("model down")), Scripted("SESSION INTENT:\nlate", delay_s=5)],
    ids=["error", "timeout"],
)
async def test_a_failing_summarizer_falls_back_to_middle_out(summarize: Scripted) -> None:
    policy = Policy(name="t", compaction=CompactionSpec(summarizer_timeout_s=0.05))
    store = MemoryStore()
    history = coding_session(20, content_chars=280)
    ex = exchange(history, policy=policy)
    out = await CompactionStage().run(ex, history, context(summarize, store))
    assert out is not None and pairing_problems(out) == []
    assert actions(ex) == ["summarizer_failed", "middle_out"]
    assert out[:2] == [SYSTEM, user(GOAL)]  # the system prompt and the first user message
    marker = out[2]["content"]
    assert marker.startswith("[agentproxy] ") and "were cut from the middle" in marker
    assert "(agentproxy_recall can read them)." in marker
    kept = out[3:]
    assert kept == history[len(history) - len(kept) :]
    ref = note(ex, "middle_out")["ref"]
    assert ref in marker and await store.get(ref) is not None
    assert tokens_of(out) <= SPEC.trigger * WINDOW


async def test_middle_out_is_checkpointed_so_a_failing_summarizer_is_not_retried_each_turn() -> (
    None
):
    store, summarize = MemoryStore(), Scripted(RuntimeError("down"))
    stage = CompactionStage()
    history = coding_session(20, content_chars=280)
    first = await stage.run(exchange(history), history, context(summarize, store))
    longer = [*history, {"role": "assistant", "content": "ok"}, user("go on")]
    ex = exchange(longer)
    second = await stage.run(ex, longer, context(summarize, store))
    assert first is not None and second is not None
    assert wire(second)[: len(first)] == wire(first) and len(summarize.calls) == 1


async def test_nothing_leaves_the_context_when_the_archive_cannot_be_written() -> None:
    class FullStore(MemoryStore):
        async def put(self, info: BlobInfo, data: bytes) -> None:
            raise OSError("disk full")

    history = coding_session(20, content_chars=280)
    ex = exchange(history)
    summarize = Scripted()
    out = await CompactionStage().run(ex, history, context(summarize, FullStore()))
    assert out is None and actions(ex) == ["store_failed"] and summarize.calls == []


# --- validity over generated histories (property style) -----------------------------------


def generated_history(rng: random.Random) -> list[Message]:
    """Parallel calls answered in any order, text turns, tiny and huge contents."""
    history: list[Message] = [SYSTEM] * rng.randint(0, 2) + [user("goal " * rng.randint(1, 50))]
    for turn in range(rng.randint(1, 40)):
        kind = rng.random()
        if kind < 0.6:
            ids = [f"c{turn}_{k}" for k in range(rng.randint(1, 4))]
            calls = [
                {
                    "id": i,
                    "type": "function",
                    "function": {
                        "name": rng.choice(["write_file", "read_file", "edit_file"]),
                        "arguments": orjson.dumps({"content": "z" * rng.randint(0, 3000)}).decode(),
                    },
                }
                for i in ids
            ]
            history.append({"role": "assistant", "content": None, "tool_calls": calls})
            rng.shuffle(ids)
            history += [result(i, "r" * rng.choice([0, 10, 500, 4000])) for i in ids]
        elif kind < 0.8:
            history.append({"role": "assistant", "content": "a" * rng.randint(0, 800)})
        else:
            history.append(user("u" * rng.randint(1, 800)))
    return history


@pytest.mark.parametrize("fails", [False, True], ids=["summary", "middle-out"])
async def test_generated_histories_always_come_out_valid(fails: bool) -> None:
    rng = random.Random(7)
    summarize = Scripted(RuntimeError("down") if fails else "SESSION INTENT:\ng")
    for case in range(150):
        history = generated_history(rng)
        window = rng.choice([500, 1_000, 2_000, 4_000])
        spec = CompactionSpec(
            truncate_min_chars=rng.choice([100, 400, 2_000]),
            keep_recent=rng.choice([0.05, 0.1, 0.3]),
            keep_messages=rng.choice([None, None, 1, 3]),
        )
        ex = exchange(history, policy=Policy(name="p", compaction=spec), session=f"s{case}")
        ex.deployment = target(window)
        out = await CompactionStage().run(ex, history, context(summarize)) or history
        assert pairing_problems(out) == [], (case, actions(ex))
        head = [m for m in history if m is SYSTEM]
        assert out[: len(head)] == head
        assert out[-1] == history[-1]  # the newest message is always kept


# --- a 50-turn session against the simulated model ----------------------------------------


INLINE = Policy(name="inline", compaction=replace(SPEC, prepare_at=None))


async def test_fifty_turns_stay_prefix_stable_with_one_summarizer_call_per_event(
    upstreams: Upstreams, sim_target: Deployment, small_sim: Simulator
) -> None:
    summarizer = Counting(real_summarizer(upstreams))
    ctx = context(summarizer)
    stage = CompactionStage()
    history: list[Message] = [SYSTEM, user(GOAL)]
    previous: list[bytes] = []
    events = summaries = 0
    for turn in range(50):
        if history[-1]["role"] == "assistant":
            content = f"# step {turn}\n" + "total += amount\n" * 40
            args = orjson.dumps({"path": f"src/step{turn}.py", "content": content}).decode()
            history.append(user(f"Step {turn}: write_file({args})"))
        # Inline summaries only: one call per event (the prepared ones: test_prepared.py).
        ex = exchange(history, policy=INLINE, deployment=sim_target, tools=TOOLS)
        out = await stage.run(ex, history, ctx) or history
        assert pairing_problems(out) == []
        reply = await send(upstreams, sim_target, {"model": "sim", "messages": out, "tools": TOOLS})
        history.append(reply)
        for tool_call in reply.get("tool_calls") or ():
            history.append(result(tool_call["id"], f"wrote {tool_call['function']['name']}: ok"))
        now = wire(out)
        event = any(
            n.action in ("summarized", "middle_out")
            or (n.action == "truncated_arguments" and n.fields["new"])
            for n in ex.notes
        )
        summaries += actions(ex).count("summarized")
        if not event and previous:
            assert now[: len(previous)] == previous, f"turn {turn}: prefix changed"
        events += event
        assert out[1] == user(GOAL)  # in every request
        if "summarized" in actions(ex):
            assert summary_sections(out[2]["content"])["SESSION INTENT"] == GOAL
        previous = now
    assert summaries >= 2, "the test must cross several compaction events"
    assert summarizer.calls == summaries
    assert sum(is_summary_request(r.body) for r in small_sim.requests) == summaries


# --- the intent beside every summary; summaries without their sections ---------------------

FORGETFUL = "In summary, the user's goal was achieved. The task was completed successfully."


async def test_a_summary_without_its_sections_is_rejected_for_middle_out() -> None:
    store, summarize = MemoryStore(), Scripted(FORGETFUL)
    ctx = context(summarize, store)
    history = coding_session(20, content_chars=280)
    ex = exchange(history)
    out = await CompactionStage().run(ex, history, ctx)
    assert out is not None and pairing_problems(out) == []
    assert actions(ex) == ["summary_rejected", "middle_out"]
    assert note(ex, "summary_rejected") == {
        "missing": ["SESSION INTENT", "SUMMARY", "ARTIFACTS", "NEXT STEPS"],
        "chars": len(FORGETFUL),
    }
    assert out[:2] == [SYSTEM, user(GOAL)] and "were cut from the middle" in out[2]["content"]
    assert not any(FORGETFUL in str(m.get("content")) for m in out)
    counted = ctx.metrics.registry.get_sample_value(
        "agentproxy_rewrites_total", {"stage": "compaction", "action": "summary_rejected"}
    )
    assert counted == 1
    # Checkpointed like any middle-out: the next turn reuses it, byte for byte.
    longer = [*history, {"role": "assistant", "content": "ok"}, user("go on")]
    again = await CompactionStage().run(exchange(longer), longer, ctx)
    assert again is not None and wire(again)[: len(out)] == wire(out)
    assert len(summarize.calls) == 1


async def test_a_policys_intent_lines_stay_beside_the_summary() -> None:
    spec = CompactionSpec(truncate_min_chars=400, truncate_head_chars=40, intent="^GOAL:.*")
    history = coding_session(20, content_chars=280)
    history[1] = user(f"Hello! Some context first.\nGOAL: {GOAL}\nThanks.")
    ex = exchange(history, policy=Policy(name="p", compaction=spec))
    out = await CompactionStage().run(ex, history, context(Scripted()))
    assert out is not None and actions(ex) == ["summarized"]
    assert out[1] == user(
        f"[agentproxy] The session's intent, as the user stated it:\nGOAL: {GOAL}"
    )
    assert out[2]["content"].startswith("[agentproxy] Earlier conversation summarized")


async def test_the_summary_is_asked_to_fit_the_room_left_under_the_target() -> None:
    summarize = Scripted()
    history = coding_session(20, content_chars=280)
    ex = exchange(history)
    out = await CompactionStage().run(ex, history, context(summarize))
    assert out is not None
    [room] = summarize.rooms
    kept = tokens_of([out[0], *out[3:]])  # the system prompt and the recent part
    full = min(int(0.2 * WINDOW), int(SPEC.target * WINDOW) - kept - tokens_of(out[1:2]))
    # Less what is kept for the ledger of the files the summarized stretch wrote.
    ledger = EMPTY.extended(history[: len(history) - len(out[3:])])
    assert ledger and room == full - ledger_room(ledger, full) < full


# --- headroom: the next compaction is several turns away ----------------------------------


class Wordy(Scripted):
    """A summarizer that fills all the room it is given, in four sections."""

    async def __call__(self, ex: Exchange, messages: list[Message], room: int = 500) -> str:
        await super().__call__(ex, messages, room)
        filler = "word " * int(room * 4 * 0.9 / 5)
        return f"SESSION INTENT:\ng\n\nSUMMARY:\n{filler}\n\nARTIFACTS:\n- none\n\nNEXT STEPS:\nn"


@pytest.mark.parametrize(
    ("keep_recent", "growth", "gap"), [(0.1, 0.12, 4), (0.3, 0.12, 3), (0.3, 0.2, 2)]
)
async def test_after_a_compaction_the_next_is_several_turns_away(
    keep_recent: float, growth: float, gap: int
) -> None:
    """Each turn adds a tool result of `growth` of the window (300-600 tokens did that to the
    2,048-token model whose window was learnt as 1,063). With the summary filling all the
    room it is given, a compaction still leaves the next one `gap` turns away: compacting
    only back under the trigger (target = trigger) had one on every turn."""
    window = 1_063
    summarize = Wordy()
    stage, ctx = CompactionStage(), context(summarize)
    deployment = target(window)
    # Summarized inline, at the trigger (written ahead they keep a little more verbatim, and
    # the next event comes sooner: test_prepared.py).
    spec = CompactionSpec(keep_recent=keep_recent, prepare_at=None)
    policy = Policy(name="p", compaction=spec)
    history: list[Message] = [SYSTEM, user(GOAL)]
    events: list[int] = []
    for turn in range(30):
        history += [
            call(f"c{turn}", "read_file", path=f"log{turn}.txt"),
            result(f"c{turn}", f"line {turn}: " + "x" * int(window * growth * 4)),
        ]
        ex = exchange(history, deployment=deployment, policy=policy)
        out = await stage.run(ex, history, ctx) or history
        assert tokens_of(out) <= SPEC.trigger * window
        if {"summarized", "middle_out"} & set(actions(ex)):
            events.append(turn)
            assert out[1] == user(GOAL)
        history.append({"role": "assistant", "content": f"ok {turn}"})
    assert len(events) >= 4, events
    assert min(b - a for a, b in itertools.pairwise(events)) >= gap, events
    assert len(summarize.calls) == len(events)
