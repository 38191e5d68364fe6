"""The Responses view: untouched items go back identical (reasoning with its encrypted content
included), rewritten ones keep their fields, and what the stages add is in Responses' form."""

from __future__ import annotations

import copy
from typing import Any

import orjson

from proxy.dialects.responses_view import ResponsesView
from proxy.pipeline import recall
from proxy.pipeline.offload import OffloadStage
from proxy.pipeline.repair import RepairStage
from proxy.policies.spec import OffloadSpec, Policy
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
