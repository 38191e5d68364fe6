"""The Anthropic view: untouched blocks go back byte for byte, rewritten ones keep their
fields, and what the stages produce stays valid under Anthropic's pairing rules."""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson

from proxy.pipeline.offload import OffloadStage
from proxy.pipeline.repair import RepairStage
from proxy.policies.spec import OffloadSpec, Policy
from proxy.sim.anthropic import check_tool_pairing
from proxy.wire.anthropic.view import AnthropicView
from tests.pipeline.factories import context, exchange

SIGNATURE = "EqQBCkgIARABGAIiQL2vx"
CACHED = {"type": "ephemeral"}


def claude_code_body() -> dict[str, Any]:
    """The shape Claude Code sends: system blocks with cache_control, a mid-conversation
    system message, a thinking turn with a tool call, its result with a breakpoint."""
    return {
        "model": "claude-opus-5-5",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": "You are Claude Code."},
            {"type": "text", "text": "Be careful.", "cache_control": CACHED},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "list the files"}]},
            {"role": "system", "content": "# Environment\ncwd: /repo"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "", "signature": SIGNATURE},
                    {"type": "text", "text": "Listing."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "Bash",
                        "input": {"command": "ls"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "a.txt\nb.txt",
                        "cache_control": CACHED,
                    },
                    {"type": "text", "text": "go on"},
                ],
            },
        ],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}, "x-unknown": 1}],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "metadata": {"user_id": '{"session_id": "abc"}'},
        "context_management": {"edits": []},
        "stream": True,
    }


def test_an_untouched_request_goes_back_identical() -> None:
    body = claude_code_body()
    sent = copy.deepcopy(body)
    view = AnthropicView.of(body)
    out = view.render(view.chat_body())
    assert orjson.dumps(out) == orjson.dumps(sent)
    assert out["messages"][2] is body["messages"][2]  # the very objects: nothing rebuilt
    assert body == sent  # and the client's body is never mutated


def test_the_view_is_chat_shaped() -> None:
    view = AnthropicView.of(claude_code_body())
    roles = [m["role"] for m in view.messages]
    assert roles == ["system", "user", "system", "assistant", "tool", "user"]
    assistant = view.messages[3]
    assert assistant["content"] == "Listing."
    assert assistant["tool_calls"][0]["function"] == {
        "name": "Bash",
        "arguments": '{"command":"ls"}',
    }
    assert view.messages[4] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": "a.txt\nb.txt",
    }


async def test_a_dangling_tool_use_gets_an_error_result_first_in_the_next_user_message() -> None:
    body = claude_code_body()
    body["messages"][3] = {"role": "user", "content": "never mind, go on"}  # no result
    view = AnthropicView.of(body)
    chat = view.chat_body()
    ex = exchange(chat["messages"])
    repaired = await RepairStage().run(ex, chat["messages"], context())
    assert repaired is not None
    out = view.render({**chat, "messages": repaired})
    user = out["messages"][3]
    assert user["role"] == "user"
    assert user["content"][0]["type"] == "tool_result"
    assert user["content"][0]["tool_use_id"] == "toolu_1" and user["content"][0]["is_error"]
    assert user["content"][1] == {"type": "text", "text": "never mind, go on"}
    assert out["messages"][2] is body["messages"][2]  # thinking turn untouched
    assert check_tool_pairing(out["messages"]) is None


async def test_an_offloaded_result_keeps_its_fields_and_its_neighbours() -> None:
    body = claude_code_body()
    huge = "\n".join(f"row {i}: data" for i in range(4000))
    body["messages"][3]["content"][0]["content"] = huge
    view = AnthropicView.of(body)
    chat = view.chat_body()
    policy = Policy(name="p", offload=OffloadSpec(min_tokens=500))
    ex = exchange(chat["messages"], policy)
    offloaded = await OffloadStage().run(ex, chat["messages"], context())
    assert offloaded is not None
    out = view.render({**chat, "messages": offloaded})
    result = out["messages"][3]["content"][0]
    assert result["type"] == "tool_result" and result["cache_control"] == CACHED
    assert result["content"].startswith("[agentproxy] This tool result was offloaded")
    assert out["messages"][3]["content"][1] == {"type": "text", "text": "go on"}
    assert out["messages"][2] is body["messages"][2]
    assert check_tool_pairing(out["messages"]) is None


def test_a_rewritten_call_keeps_the_thinking_block_and_signature() -> None:
    body = claude_code_body()
    view = AnthropicView.of(body)
    chat = view.chat_body()
    turn = chat["messages"][3]
    call = turn["tool_calls"][0]
    truncated = {**call, "function": {"name": "Bash", "arguments": '{"command": "l…"}'}}
    messages = [*chat["messages"][:3], {**turn, "tool_calls": [truncated]}, *chat["messages"][4:]]
    out = view.render({**chat, "messages": messages})
    blocks = out["messages"][2]["content"]
    assert blocks[0] == {"type": "thinking", "thinking": "", "signature": SIGNATURE}
    assert blocks[2] == {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "Bash",
        "input": {"command": "l…"},
    }


def test_a_summary_replacing_the_start_is_a_user_message() -> None:
    body = claude_code_body()
    view = AnthropicView.of(body)
    chat = view.chat_body()
    summary = {"role": "user", "content": "[agentproxy] Earlier conversation summarized."}
    kept = chat["messages"][5:]  # the text after the tool result
    out = view.render({**chat, "messages": [chat["messages"][0], summary, *kept]})
    assert out["system"] is body["system"]
    assert out["messages"][0]["role"] == "user"
    assert out["messages"][0]["content"][0]["text"] == summary["content"]
    assert out["messages"][1] == {"role": "user", "content": [{"type": "text", "text": "go on"}]}
    assert check_tool_pairing(out["messages"]) is None


def test_the_recall_tool_is_offered_in_anthropics_form() -> None:
    from proxy.pipeline import recall

    body = claude_code_body()
    view = AnthropicView.of(body)
    chat = view.chat_body()
    recall.offer(chat)
    out = view.render(chat)
    assert out["tools"][0] is body["tools"][0]
    assert out["tools"][1]["name"] == recall.TOOL_NAME
    assert out["tools"][1]["input_schema"]["properties"]["ref"]["type"] == "string"


def test_a_summary_carries_a_cache_breakpoint_when_one_is_free() -> None:
    body = claude_code_body()  # two breakpoints: a system block, a tool result
    view = AnthropicView.of(body)
    chat = view.chat_body()
    summary = {"role": "user", "content": "[agentproxy] Earlier conversation summarized."}
    out = view.render({**chat, "messages": [chat["messages"][0], summary, *chat["messages"][5:]]})
    assert out["messages"][0]["content"] == [
        {
            "type": "text",
            "text": "[agentproxy] Earlier conversation summarized.",
            "cache_control": {"type": "ephemeral"},
        }
    ]
    body["tools"][0]["cache_control"] = CACHED  # four in what is sent: none to spare
    body["system"][0]["cache_control"] = CACHED
    view = AnthropicView.of(body)
    chat = view.chat_body()
    out = view.render({**chat, "messages": [chat["messages"][0], summary, *chat["messages"][4:]]})
    assert out["messages"][0] == summary


def test_a_moving_cache_breakpoint_leaves_the_view_of_older_turns_unchanged() -> None:
    """Claude Code moves its breakpoint to the newest block each turn: the stages must still
    see turn N as turn N-1 plus new messages (their memos compare the views)."""
    first = claude_code_body()
    second = copy.deepcopy(first)
    del second["messages"][3]["content"][0]["cache_control"]  # moved on...
    second["messages"].append(
        {"role": "assistant", "content": [{"type": "text", "text": "Two files."}]}
    )
    second["messages"].append(
        {"role": "user", "content": [{"type": "text", "text": "ok", "cache_control": CACHED}]}
    )  # ...to the newest block
    before, after = AnthropicView.of(first).messages, AnthropicView.of(second).messages
    assert after[: len(before)] == before


def _turns(seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two consecutive turns of a random Claude-Code-like session: the second appends, and
    sometimes edits an old message, moves the breakpoint or changes the system prompt."""
    rng = random.Random(seed)
    body = claude_code_body()
    for step in range(rng.randint(0, 6)):
        call = f"toolu_{seed}_{step}"
        body["messages"].append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "", "signature": f"sig{step}"},
                    {"type": "tool_use", "id": call, "name": "Bash", "input": {"n": step}},
                ],
            }
        )
        blocks: list[Any] = [{"type": "tool_result", "tool_use_id": call, "content": "x" * step}]
        if rng.random() < 0.5:
            blocks.append({"type": "text", "text": f"note {step}"})
        body["messages"].append({"role": "user", "content": blocks})
    later = copy.deepcopy(body)
    later["messages"].append({"role": "assistant", "content": [{"type": "text", "text": "ok"}]})
    later["messages"].append({"role": "user", "content": "next"})
    change = rng.choice(["append", "edit", "system", "no-system", "breakpoint", "shorter"])
    if change == "edit":
        at = rng.randrange(len(later["messages"]))
        later["messages"][at] = {"role": later["messages"][at]["role"], "content": "edited"}
    elif change == "system":
        later["system"] = "a new system prompt"
    elif change == "no-system":
        del later["system"]
    elif change == "breakpoint":
        for message in later["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                block.pop("cache_control", None)
    elif change == "shorter":
        later["messages"] = later["messages"][: rng.randint(1, len(later["messages"]))]
    return body, later


async def test_a_view_lent_the_last_turns_view_is_the_view_built_afresh() -> None:
    for seed in range(300):
        first, second = _turns(seed)
        previous = AnthropicView.of(first)
        lent, fresh = AnthropicView.of(second, previous.memory()), AnthropicView.of(second)
        assert lent.messages == fresh.messages, seed
        for view in (lent, fresh):  # the same bytes upstream, untouched or repaired
            chat = view.chat_body()
            untouched = orjson.dumps(view.render(chat))
            repaired = await RepairStage().run(
                exchange(chat["messages"]), chat["messages"], context()
            )
            rewritten = orjson.dumps(
                view.render({**chat, "messages": repaired or chat["messages"][:-1]})
            )
            if view is lent:
                expected = (untouched, rewritten)
            else:
                assert (untouched, rewritten) == expected, seed


def test_the_native_prefix_counts_the_messages_equal_to_the_last_turns() -> None:
    """What the recording takes from the last turn: native messages, never view messages."""
    for seed in range(300):
        first, second = _turns(seed)
        previous = AnthropicView.of(first)
        prefix = AnthropicView.of(second, previous.memory()).native_prefix()
        old, new = first["messages"], second["messages"]
        equal = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), None)
        shared = min(len(old), len(new)) if equal is None else equal
        assert prefix.key == "messages" and prefix.shared == shared, seed
        base = previous.native_prefix().turn if shared else None
        assert prefix.base is base and prefix.turn is not previous.native_prefix().turn, seed


def test_the_shared_history_is_the_previous_views_very_messages() -> None:
    first = _turns(3)[0]
    second = copy.deepcopy(first)
    second["messages"] += [
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "go"},
    ]
    previous = AnthropicView.of(first)
    view = AnthropicView.of(second, previous.memory())
    shared = len(previous.messages)
    assert all(a is b for a, b in zip(view.messages[:shared], previous.messages, strict=True))
    assert len(view.messages) > shared


def test_an_untouched_turn_lent_a_view_sends_this_turns_own_blocks() -> None:
    """Equal is not identical (1 == 1.0): what goes upstream is always this turn's bytes."""
    first = claude_code_body()
    second = copy.deepcopy(first)
    second["messages"][3]["content"][1]["extra"] = 1
    first["messages"][3]["content"][1]["extra"] = 1.0
    view = AnthropicView.of(second, AnthropicView.of(first).memory())
    chat = view.chat_body()
    offloaded = [
        *chat["messages"][:-2],
        {**chat["messages"][-2], "content": "gone"},
        chat["messages"][-1],
    ]
    out = view.render({**chat, "messages": offloaded})
    assert out["messages"][3]["content"][1] is second["messages"][3]["content"][1]


def compacted_body() -> dict[str, Any]:
    """A history whose client sent back a compaction block: what came before it is dropped."""
    compaction = {"type": "compaction", "content": "SUMMARY: the files were listed."}
    use = {"type": "tool_use", "id": "toolu_9", "name": "Bash", "input": {"command": "cat a"}}
    return {
        "model": "claude-opus-5-5",
        "max_tokens": 1000,
        "messages": [
            {"role": "user", "content": "list the files"},
            {"role": "assistant", "content": [{"type": "text", "text": "old answer"}]},
            {"role": "user", "content": "now read a"},
            {
                "role": "assistant",
                "content": [compaction, {"type": "text", "text": "Reading."}, use],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_9", "content": "x" * 4000}
                ],
            },
        ],
    }


def test_a_compaction_block_starts_the_history_as_a_summary() -> None:
    body = compacted_body()
    view = AnthropicView.of(body)
    chat = view.chat_body()
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "tool"]
    assert chat["messages"][0]["content"].endswith("SUMMARY: the files were listed.")
    assert view.render(chat) is body  # untouched: the client's own body (Anthropic drops)
    # A later turn lends the same view messages; the summary's text is the same bytes.
    later = copy.deepcopy(body)
    later["messages"].append({"role": "assistant", "content": [{"type": "text", "text": "ok"}]})
    again = AnthropicView.of(later, view.memory()).chat_body()
    assert again["messages"][:3] == chat["messages"] and len(again["messages"]) == 4


async def test_a_rewritten_compacted_history_keeps_its_block_and_what_came_before() -> None:
    body = compacted_body()
    view = AnthropicView.of(body)
    chat = view.chat_body()
    policy = Policy(name="p", offload=OffloadSpec(min_tokens=100))
    ex = exchange(chat["messages"], policy=policy)
    out = await OffloadStage().run(ex, chat["messages"], context())
    assert out is not None
    native = view.render({**chat, "messages": out})["messages"]
    assert native[:3] == body["messages"][:3]  # before the block: as sent, Anthropic drops it
    assert native[3] == body["messages"][3]  # the block and the rest of its turn, one message
    assert "offloaded" in native[4]["content"][0]["content"]
    assert check_tool_pairing(native) is None
