"""Validity: hundreds of generated broken histories all come out of repair valid and stable,
and the simulated upstream, which enforces OpenAI's pairing rules, accepts every one of them
while rejecting the originals."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from proxy.exchange import Exchange
from proxy.messages import Message, pairing_problems
from proxy.pipeline.repair import ACTIONS, RepairStage
from proxy.policies.spec import Policy, RepairSpec
from proxy.sim import Simulator
from proxy.sim.chat import MISSING_TOOL_RESULTS, ORPHAN_TOOL, check_tool_pairing
from tests.pipeline.factories import context, exchange

HISTORIES = 400
TOOL_NAMES = ("read_file", "search", "write_file")
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in TOOL_NAMES
]
POLICIES = (Policy(name="note"), Policy(name="drop", repair=RepairSpec(orphans="drop")))


class HistoryMaker:
    """Agent turns with everything that goes wrong in the wild, reproducibly from a seed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.ids = 0

    def new_id(self) -> str:
        if self.rng.random() < 0.1:
            return f"call_{self.rng.randint(0, 2)}"  # providers that reuse ids every turn
        self.ids += 1
        return f"call_{self.ids:04d}x"

    def text(self, role: str) -> Message:
        return {"role": role, "content": f"{role} says {self.rng.randint(0, 999)}"}

    def result(self, call_id: str) -> Message:
        roll = self.rng.random()
        if roll < 0.05:
            content: Any = "z" * self.rng.randint(20_000, 120_000)  # huge result
        elif roll < 0.15:
            content = [{"type": "text", "text": f"part of {call_id}"}]
        else:
            content = f"result of {call_id}"
        return {"role": "tool", "tool_call_id": call_id, "content": content}

    def call(self, call_id: str) -> dict[str, Any]:
        arguments = '{"path": "notes.txt"}'
        if self.rng.random() < 0.08:
            arguments = self.rng.choice(['{"path": "no', "path=notes.txt", "{'a': 1}"])
        name = self.rng.choice(TOOL_NAMES)
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def history(self) -> list[Message]:
        rng = self.rng
        out: list[Message] = [self.text("system")] if rng.random() < 0.7 else []
        out.append(self.text("user"))
        late: list[Message] = []  # results that will turn up after other messages
        for _ in range(rng.randint(1, 10)):
            if rng.random() < 0.25:
                out.append(self.text(rng.choice(("user", "assistant", "assistant", "system"))))
                continue
            ids = [self.new_id() for _ in range(rng.choice((1, 1, 2, 3, 4)))]
            out.append(
                {"role": "assistant", "content": None, "tool_calls": list(map(self.call, ids))}
            )
            block: list[Message] = []
            for call_id in ids:
                fate = rng.random()
                if fate < 0.65:
                    block.append(self.result(call_id))
                elif fate < 0.75:
                    block += [self.result(call_id), self.result(call_id)]  # duplicate
                elif fate < 0.87:
                    late.append(self.result(call_id))  # misplaced
                # else: dangling, never answered
            rng.shuffle(block)  # parallel results come in any order
            out += block
            if rng.random() < 0.15:
                out.insert(rng.randrange(len(out) + 1), self.result(f"ghost_{rng.randint(0, 99)}"))
            if late and rng.random() < 0.5:
                out.append(late.pop(0))
        return out


def histories() -> list[list[Message]]:
    return [HistoryMaker(seed).history() for seed in range(HISTORIES)]


async def repaired(messages: list[Message], policy: Policy) -> tuple[list[Message], Exchange]:
    ex = exchange(messages, policy)
    out = await RepairStage().run(ex, messages, context())
    return (messages if out is None else out), ex


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
async def test_every_repaired_history_is_valid_and_repairing_again_changes_nothing(
    policy: Policy,
) -> None:
    applied: set[str] = set()
    broken = 0
    for history in histories():
        broken += bool(pairing_problems(history))
        out, ex = await repaired(history, policy)
        applied.update(note.action for note in ex.notes)
        assert pairing_problems(out) == []
        assert check_tool_pairing(out) is None
        # Non-tool messages all survive, in order, as the very same objects.
        kept = [m for m in out if m["role"] != "tool" and not _is_note(m)]
        originals = [m for m in history if m["role"] != "tool"]
        assert all(a is b for a, b in zip(kept, originals, strict=True))
        again, ex_again = await repaired(out, policy)
        assert again is out and ex_again.notes == []
    assert broken > HISTORIES // 2  # the generator really does produce broken histories
    orphans = "dropped_orphan" if policy.repair.orphans == "drop" else "noted_orphan"
    applied.discard("archived")  # what the fixes took out, stored: not a fix of its own
    assert applied == set(ACTIONS) - {"noted_orphan", "dropped_orphan"} | {orphans}


def _is_note(message: Message) -> bool:
    return str(message.get("content")).startswith("[agentproxy] A tool result arrived")


async def test_appending_a_turn_appends_to_the_repaired_history() -> None:
    """Stability: the next turn (new ids) leaves the repaired past byte for byte as it was."""
    call = {"id": "new", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    turn: list[Message] = [
        {"role": "user", "content": "next"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "new", "content": "fine"},
    ]
    for history in histories()[:100]:
        before, _ = await repaired(history, POLICIES[0])
        after, _ = await repaired(history + turn, POLICIES[0])
        assert orjson.dumps(after) == orjson.dumps(before + turn)


async def test_the_simulated_upstream_accepts_repaired_and_rejects_broken_histories(
    aiohttp_server: Any, aiohttp_client: Any
) -> None:
    # A window big enough for the huge results: this test is about pairing, not overflow.
    client = await aiohttp_client(await aiohttp_server(Simulator(context_window=10**8).app()))
    unpaired = [h for h in histories() if _rejected_by_openai(h)]
    for history in unpaired[:: len(unpaired) // 30][:30]:
        body = {"model": "sim", "messages": history, "tools": TOOLS}
        response = await client.post("/v1/chat/completions", json=body)
        error = (await response.json())["error"]["message"]
        assert response.status == 400
        assert error.startswith(
            (ORPHAN_TOOL, MISSING_TOOL_RESULTS, "Invalid parameter: 'tool_call_id'")
        )
        body["messages"], _ = await repaired(history, POLICIES[0])
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status == 200, await response.text()


def _rejected_by_openai(history: list[Message]) -> bool:
    # Duplicates alone pass OpenAI's check; orphans and unanswered calls do not.
    return any(p.kind != "duplicate" for p in pairing_problems(history))
