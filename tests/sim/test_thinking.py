"""Thinking in the Anthropic twin, driven by the `anthropic` SDK over real sockets: signed
blocks that come back intact are accepted, changed ones get the API's own 400."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

from proxy.sim import Simulator, run_simulator
from proxy.sim.thinking import REDACTED_TRIGGER

JSON = dict[str, Any]
THINKING = {"type": "enabled", "budget_tokens": 1024}
TOOLS: list[Any] = [
    {
        "name": "read_file",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]
ASK = {"role": "user", "content": 'read_file({"path": "notes.txt"})'}


@pytest.fixture
def sim() -> Simulator:
    return Simulator()


@pytest.fixture
async def client(sim: Simulator) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with (
        run_simulator(sim) as url,
        anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-test", max_retries=0) as sdk,
    ):
        yield sdk


async def create(client: anthropic.AsyncAnthropic, messages: list[Any], **extra: Any) -> Any:
    extra = {"max_tokens": 2048, "thinking": THINKING, "tools": TOOLS} | extra
    return await client.messages.create(model="claude-sim", messages=messages, **extra)


def answered(first: Any, result: str = "milk") -> list[Any]:
    """The history after `first` (a tool_use turn): its content as is, then the result."""
    [call] = [block for block in first.content if block.type == "tool_use"]
    reply = [{"type": "tool_result", "tool_use_id": call.id, "content": result}]
    return [
        ASK,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": reply},
    ]


def dumped(first: Any) -> list[JSON]:
    return [block.model_dump(exclude_none=True) for block in first.content]


async def bad_request(client: anthropic.AsyncAnthropic, messages: list[Any], **kw: Any) -> str:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await create(client, messages, **kw)
    body: Any = caught.value.body
    assert caught.value.status_code == 400 and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    message: str = body["error"]["message"]
    return message


async def test_a_signed_thinking_block_round_trips(client: anthropic.AsyncAnthropic) -> None:
    first = await create(client, [ASK])
    thinking, call = first.content
    assert thinking.type == "thinking" and thinking.thinking.startswith("To answer this")
    assert len(thinking.signature) > 40
    assert (call.type, call.name, call.input) == ("tool_use", "read_file", {"path": "notes.txt"})
    assert first.usage.output_tokens > 10  # the reasoning is paid for

    final = await create(client, answered(first))
    assert final.content[0].type == "thinking"
    assert final.content[1].text == "read_file returned: milk"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("signature", "A" * 68, "messages.1.content.0: Invalid `signature` in `thinking` block"),
        ("thinking", "I will just guess.", "messages.1.content.0: Invalid `signature`"),
        ("signature", None, "messages.1.content.0.thinking.signature: Field required"),
    ],
)
async def test_a_changed_thinking_block_is_refused(
    client: anthropic.AsyncAnthropic, field: str, value: Any, message: str
) -> None:
    first = await create(client, [ASK])
    content = dumped(first)
    if value is None:
        del content[0][field]
    else:
        content[0][field] = value
    history = answered(first)
    history[1] = {"role": "assistant", "content": content}
    assert (await bad_request(client, history)).startswith(message)


async def test_a_signature_from_another_simulator_is_refused(
    client: anthropic.AsyncAnthropic,
) -> None:
    async with run_simulator(Simulator()) as other_url:
        other = anthropic.AsyncAnthropic(base_url=other_url, api_key="k", max_retries=0)
        foreign = await create(other, [ASK])
        await other.close()
    assert "Invalid `signature`" in await bad_request(client, answered(foreign))


async def test_a_vouched_foreign_block_is_accepted_only_as_it_was_vouched(
    sim: Simulator, client: anthropic.AsyncAnthropic
) -> None:
    """A replay's simulator takes the blocks a recorded client sent as its own (another API
    signed them), exactly: the same block with other text is still refused."""
    async with run_simulator(Simulator()) as other_url:
        other = anthropic.AsyncAnthropic(base_url=other_url, api_key="k", max_retries=0)
        foreign = await create(other, [ASK])
        await other.close()
    history = answered(foreign)
    history[1] = {"role": "assistant", "content": dumped(foreign)}  # as a recording holds it
    sim.vouch("/v1/messages", {"messages": history})
    assert (await create(client, history)).content[1].text == "read_file returned: milk"
    changed = dumped(foreign)
    changed[0]["thinking"] = "I will just guess."
    history[1] = {"role": "assistant", "content": changed}
    assert "Invalid `signature`" in await bad_request(client, history)


async def test_a_tool_loop_must_keep_its_thinking_block(client: anthropic.AsyncAnthropic) -> None:
    first = await create(client, [ASK])
    history = answered(first)
    history[1] = {"role": "assistant", "content": dumped(first)[1:]}
    message = await bad_request(client, history)
    assert message.startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
        "`tool_use`. When `thinking` is enabled, a final `assistant` message must start with a "
        "thinking block"
    )
    # Without thinking the same history is fine: the rule belongs to thinking.
    final = await client.messages.create(
        model="claude-sim", max_tokens=100, messages=history, tools=TOOLS
    )
    assert final.content[0].type == "text"


async def test_thinking_is_opt_in(client: anthropic.AsyncAnthropic) -> None:
    plain = await client.messages.create(model="claude-sim", max_tokens=100, messages=[ASK])
    assert [block.type for block in plain.content] == ["text"]
    disabled = await create(client, [ASK], thinking={"type": "disabled"})
    assert [block.type for block in disabled.content] == ["tool_use"]


async def test_omitted_display_signs_an_empty_text(client: anthropic.AsyncAnthropic) -> None:
    adaptive = {"type": "adaptive", "display": "omitted"}
    first = await create(client, [ASK], thinking=adaptive)
    assert first.content[0].type == "thinking" and first.content[0].thinking == ""
    other = await create(client, [ASK, {"role": "assistant", "content": "hm"}, ASK])
    assert first.content[0].signature != other.content[0].signature  # not one shared value
    final = await create(client, answered(first), thinking=adaptive)
    assert final.content[-1].text == "read_file returned: milk"


async def test_redacted_thinking_round_trips(client: anthropic.AsyncAnthropic) -> None:
    ask = {"role": "user", "content": f'{REDACTED_TRIGGER} read_file({{"path": "a"}})'}
    first = await create(client, [ask])
    assert first.content[0].type == "redacted_thinking" and first.content[0].data
    history = [ask, *answered(first)[1:]]
    assert (await create(client, history)).content[-1].type == "text"
    content = dumped(first)
    content[0]["data"] = content[0]["data"][:-4] + "AAA="
    history[1] = {"role": "assistant", "content": content}
    message = await bad_request(client, history)
    assert message == "messages.1.content.0: Invalid `data` in `redacted_thinking` block"


async def test_streamed_thinking_comes_first_then_its_signature(
    client: anthropic.AsyncAnthropic,
) -> None:
    stream = await create(client, [ASK], stream=True)
    events = [event async for event in stream]
    kinds = [
        event.type + (f":{event.delta.type}" if event.type == "content_block_delta" else "")
        for event in events
    ]
    thinking_deltas = kinds.count("content_block_delta:thinking_delta")
    json_deltas = kinds.count("content_block_delta:input_json_delta")
    assert thinking_deltas > 1 and json_deltas > 1  # (the SDK drops the ping)
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta:thinking_delta"] * thinking_deltas,
        "content_block_delta:signature_delta",
        "content_block_stop",
        "content_block_start",
        *["content_block_delta:input_json_delta"] * json_deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[1].content_block
    assert (start.type, start.thinking, start.signature) == ("thinking", "", "")
    assert events[-2].delta.stop_reason == "tool_use"

    # The streamed block, put back together by the SDK, is accepted like a non-streamed one.
    async with client.messages.stream(
        model="claude-sim", max_tokens=2048, messages=[ASK], thinking=THINKING, tools=TOOLS
    ) as streamed:
        first = await streamed.get_final_message()
    assert first.content[0].thinking.startswith("To answer this")
    final = await create(client, answered(first))
    assert final.content[-1].text == "read_file returned: milk"


@pytest.mark.parametrize(
    ("thinking", "max_tokens", "message"),
    [
        (
            {"type": "enabled", "budget_tokens": 100},
            2048,
            "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
        ),
        ({"type": "enabled"}, 2048, "thinking.enabled.budget_tokens: Field required"),
        (
            {"type": "enabled", "budget_tokens": 4096},
            4096,
            "`max_tokens` must be greater than `thinking.budget_tokens`.",
        ),
        (
            {"type": "adaptive", "display": "full"},
            2048,
            "thinking.adaptive.display: Input should be 'summarized' or 'omitted'",
        ),
        ({"type": "on"}, 2048, "thinking: Input tag 'on' found using 'type' does not match"),
    ],
)
async def test_bad_thinking_settings_are_400(
    client: anthropic.AsyncAnthropic, thinking: JSON, max_tokens: int, message: str
) -> None:
    got = await bad_request(client, [ASK], thinking=thinking, max_tokens=max_tokens)
    assert got.startswith(message)


async def test_the_rule_is_for_the_turn_a_tool_loop_is(client: anthropic.AsyncAnthropic) -> None:
    """A tool loop is one assistant turn: its first message must start with thinking, the later
    ones need not (a model without interleaved thinking thinks once, at the start)."""
    first = await create(client, [ASK])
    history = answered(first)
    step = {"type": "tool_use", "id": "toolu_step2", "name": "read_file", "input": {"path": "b"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_step2", "content": "eggs"}
    loop = [
        *history,
        {"role": "assistant", "content": [step]},
        {"role": "user", "content": [result]},
    ]
    assert (await create(client, loop)).content[-1].type == "text"

    signed = (await create(client, [{"role": "user", "content": "think about b"}])).content[0]
    assert signed.type == "thinking"
    lost = [dict(m) for m in loop]
    lost[1] = {"role": "assistant", "content": dumped(first)[1:]}
    lost[3] = {"role": "assistant", "content": [signed.model_dump(exclude_none=True), step]}
    message = await bad_request(client, lost)
    assert message.startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
        "`tool_use`."
    )


async def test_thinking_off_lifts_the_rule(
    client: anthropic.AsyncAnthropic,
) -> None:
    first = await create(client, [ASK])
    history = answered(first)
    history[1] = {"role": "assistant", "content": dumped(first)[1:]}
    for off in ({"type": "disabled"}, None):
        extra = {"thinking": off} if off else {"thinking": anthropic.NOT_GIVEN}
        final = await create(client, history, **extra)
        assert [b.type for b in final.content] == ["text"]  # and no thinking of its own
