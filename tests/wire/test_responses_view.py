"""The Responses view: untouched items go back identical (reasoning with its encrypted content
included), rewritten ones keep their fields, and what the stages add is in Responses' form."""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson

from proxy.pipeline import recall
from proxy.pipeline.offload import OffloadStage
from proxy.pipeline.repair import RepairStage
from proxy.policies.spec import OffloadSpec, Policy
from proxy.wire.responses.view import ResponsesView
from tests.pipeline.factories import context, exchange

SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "array"}}},
    "strict": False,
}


def codex_body() -> dict[str, Any]:
    """The shape Codex sends: instructions, a developer message, reasoning with encrypted
    content before a call, a custom tool, store false, the whole input each turn."""
    return {
        "model": "gpt-sim",
        "instructions": "You are Codex.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Sandbox: on"}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "list files"}],
            },
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA-secret"},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "shell",
                "arguments": '{"command":["ls"]}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt\nb.txt"},
            {
                "type": "custom_tool_call",
                "call_id": "call_2",
                "name": "apply_patch",
                "input": "*** Begin Patch",
            },
            {"type": "custom_tool_call_output", "call_id": "call_2", "output": "done"},
        ],
        "tools": [SHELL, {"type": "custom", "name": "apply_patch"}, {"type": "web_search"}],
        "tool_choice": "auto",
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
    }


def test_an_untouched_request_goes_back_identical() -> None:
    body = codex_body()
    sent = copy.deepcopy(body)
    view = ResponsesView.of(body)
    out = view.render(view.chat_body())
    assert orjson.dumps(out) == orjson.dumps(sent)
    assert body == sent


def test_the_view_is_chat_shaped() -> None:
    view = ResponsesView.of(codex_body())
    roles = [m["role"] for m in view.messages]
    assert roles == ["system", "developer", "user", "assistant", "tool", "assistant", "tool"]
    assert view.messages[3]["tool_calls"][0]["function"] == {
        "name": "shell",
        "arguments": '{"command":["ls"]}',
    }
    assert view.messages[5]["tool_calls"][0]["function"]["arguments"] == "*** Begin Patch"


async def test_a_call_without_output_gets_one_of_its_own_kind() -> None:
    body = codex_body()
    del body["input"][6]  # the custom call's output never came
    body["input"].append({"role": "user", "content": "go on"})
    view = ResponsesView.of(body)
    chat = view.chat_body()
    repaired = await RepairStage().run(exchange(chat["messages"]), chat["messages"], context())
    assert repaired is not None
    items = view.render({**chat, "messages": repaired})["input"]
    assert items[6]["type"] == "custom_tool_call_output" and items[6]["call_id"] == "call_2"
    assert "did not complete" in items[6]["output"]
    assert items[7] == {"role": "user", "content": "go on"}
    assert items[2] == body["input"][2]  # the reasoning item, untouched, in its place


async def test_an_offloaded_output_keeps_its_fields() -> None:
    body = codex_body()
    body["input"][4]["output"] = "\n".join(f"row {i}: data" for i in range(4000))
    view = ResponsesView.of(body)
    chat = view.chat_body()
    policy = Policy(name="p", offload=OffloadSpec(min_tokens=500))
    ex = exchange(chat["messages"], policy)
    offloaded = await OffloadStage().run(ex, chat["messages"], context())
    assert offloaded is not None
    items = view.render({**chat, "messages": offloaded})["input"]
    assert items[4]["type"] == "function_call_output" and items[4]["call_id"] == "call_1"
    assert items[4]["output"].startswith("[agentproxy] This tool result was offloaded")
    assert items[2:4] == body["input"][2:4]


def test_a_recall_round_sends_the_reply_back_whole_and_the_tool_flat() -> None:
    body = codex_body()
    view = ResponsesView.of(body)
    chat = view.chat_body()
    recall.offer(chat)
    reasoning = {"type": "reasoning", "id": "rs_9", "summary": [], "encrypted_content": "gAAAA-9"}
    call = {
        "type": "function_call",
        "id": "fc_9",
        "call_id": "call_9",
        "name": recall.TOOL_NAME,
        "arguments": '{"ref": "ap_1"}',
        "status": "completed",
    }
    view.remember_turn([reasoning, call])
    turn = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_9",
                "type": "function",
                "function": {"name": recall.TOOL_NAME, "arguments": '{"ref": "ap_1"}'},
            }
        ],
    }
    answer = {"role": "tool", "tool_call_id": "call_9", "content": "the file"}
    out = view.render({**chat, "messages": [*chat["messages"], turn, answer]})
    assert out["input"][-3:] == [
        reasoning,
        call,
        {"type": "function_call_output", "call_id": "call_9", "output": "the file"},
    ]
    assert out["tools"][:3] == body["tools"]
    assert out["tools"][3]["name"] == recall.TOOL_NAME and out["tools"][3]["type"] == "function"


def _turns(seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two consecutive turns of a random Codex-like session: the second appends, and sometimes
    edits or drops an item, ends on a call run, repeats a call_id or changes instructions."""
    rng = random.Random(seed)
    body = codex_body()
    for step in range(rng.randint(0, 6)):
        call = f"call_{seed}_{step}"
        if rng.random() < 0.5:
            body["input"].append({"type": "reasoning", "summary": [], "encrypted_content": "e"})
        for n in range(rng.randint(1, 2)):  # parallel calls: one assistant turn
            body["input"].append(
                {
                    "type": "function_call",
                    "call_id": f"{call}{n}",
                    "name": "shell",
                    "arguments": "{}",
                }
            )
        for n in range(rng.randint(0, 2)):  # a call may stay unanswered
            body["input"].append(
                {"type": "function_call_output", "call_id": f"{call}{n}", "output": "x" * step}
            )
    later = copy.deepcopy(body)
    later["input"].append({"type": "message", "role": "user", "content": "next"})
    change = rng.choice(["append", "edit", "drop", "calls", "repeat", "instructions", "string"])
    items = later["input"]
    if change == "edit":
        items[rng.randrange(len(items))] = {"type": "message", "role": "user", "content": "e"}
    elif change == "drop":
        del items[rng.randrange(len(items)) :]
    elif change == "calls":
        items.append({"type": "function_call", "call_id": "call_z", "name": "s", "arguments": "{}"})
    elif change == "repeat":
        items.append({"type": "function_call_output", "call_id": "call_1", "output": "again"})
    elif change == "instructions":
        later["instructions"] = rng.choice(["Other.", ""])
    elif change == "string":
        later["input"] = "just text"
    return body, later


async def test_a_view_lent_the_last_turns_view_is_the_view_built_afresh() -> None:
    for seed in range(300):
        first, second = _turns(seed)
        previous = ResponsesView.of(first)
        lent, fresh = ResponsesView.of(second, previous.memory()), ResponsesView.of(second)
        assert lent.messages == fresh.messages, seed
        sent = []
        for view in (lent, fresh):  # the same items upstream, untouched or repaired
            chat = view.chat_body()
            untouched = orjson.dumps(view.render(chat))
            repaired = await RepairStage().run(
                exchange(chat["messages"]), chat["messages"], context()
            )
            changed = repaired or chat["messages"][:-1]
            sent.append((untouched, orjson.dumps(view.render({**chat, "messages": changed}))))
        assert sent[0] == sent[1], seed


def test_the_native_prefix_counts_the_input_items_equal_to_the_last_turns() -> None:
    """What the recording takes from the last turn: native items, never view messages."""

    def items(body: dict[str, Any]) -> list[Any]:
        given = body["input"]
        return [{"role": "user", "content": given}] if isinstance(given, str) else given

    for seed in range(300):
        first, second = _turns(seed)
        previous = ResponsesView.of(first)
        prefix = ResponsesView.of(second, previous.memory()).native_prefix()
        old, new = items(first), items(second)
        equal = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), None)
        shared = min(len(old), len(new)) if equal is None else equal
        assert prefix.key == "input" and prefix.shared == shared, seed
        base = previous.native_prefix().turn if shared else None
        assert prefix.base is base and prefix.turn is not previous.native_prefix().turn, seed
    view = ResponsesView.of(codex_body())
    again = ResponsesView.of(codex_body(), view.memory()).native_prefix()
    assert again.base is view.native_prefix().turn


def test_the_shared_input_is_the_previous_views_very_messages() -> None:
    first = codex_body()
    second = copy.deepcopy(first)
    second["input"].append({"type": "message", "role": "user", "content": "go on"})
    previous = ResponsesView.of(first)
    view = ResponsesView.of(second, previous.memory())
    shared = len(previous.messages)
    assert all(a is b for a, b in zip(view.messages[:shared], previous.messages, strict=True))
    assert len(view.messages) == shared + 1
