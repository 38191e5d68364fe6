"""The Anthropic twin through the `anthropic` SDK over real sockets: mid-conversation system
messages, the headers it records, count_tokens and the window rule."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

from proxy.sim import Simulator, run_simulator
from proxy.sim.anthropic import count_prompt_tokens
from tests.support.sim_responders import ToolRoundTrip

JSON = dict[str, Any]
KEY = "sk-ant-test"
MID_CONVERSATION = "mid-conversation-tool-changes-2026-07-01"  # as Claude Code 2.1 sends it
WITH_SYSTEM: list[Any] = [
    {"role": "user", "content": "list the files"},
    {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /repo"}]},
]


@pytest.fixture
def sim() -> Simulator:
    return Simulator(api_key=KEY)


@pytest.fixture
async def client(sim: Simulator) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with (
        run_simulator(sim) as url,
        anthropic.AsyncAnthropic(base_url=url, api_key=KEY, max_retries=0) as sdk,
    ):
        yield sdk


async def refused(call: Any) -> str:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await call
    message: str = caught.value.body["error"]["message"]  # type: ignore[index]
    return message


async def test_system_messages_need_the_mid_conversation_beta(
    client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    plain = client.messages.create(model="claude-sim", max_tokens=50, messages=WITH_SYSTEM)
    assert await refused(plain) == "messages.1.role: Input should be 'user' or 'assistant'"

    reply = await client.beta.messages.create(
        model="claude-sim", max_tokens=50, messages=WITH_SYSTEM, betas=[MID_CONVERSATION]
    )
    assert reply.content[0].text == "You said: list the files"
    first, second = sim.requests
    assert (first.status, second.status) == (400, 200)
    assert second.betas == [MID_CONVERSATION]  # (Claude Code also adds ?beta=true: .query)
    sent_version = client.default_headers["anthropic-version"]  # 2023-06-01 from Claude Code
    assert second.headers["anthropic-version"] == sent_version
    assert second.api_key == KEY  # this SDK sends it as a Bearer token, Claude Code as x-api-key
    assert first.betas == []


async def test_a_tool_named_before_a_system_entry_is_called(
    client: anthropic.AsyncAnthropic,
) -> None:
    """Claude Code's turn ends with system entries: the scripted model reads the user's
    message before them, calls the tool it names, then quotes the result."""
    tools: Any = [{"name": "Bash", "input_schema": {"type": "object"}}]
    asked: list[Any] = [
        {"role": "user", "content": 'Bash({"command": "ls"})'},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /repo"}]},
    ]
    call = await client.beta.messages.create(
        model="claude-sim", max_tokens=50, messages=asked, tools=tools, betas=[MID_CONVERSATION]
    )
    (use,) = call.content
    assert use.type == "tool_use" and (use.name, use.input) == ("Bash", {"command": "ls"})
    answered: list[Any] = [
        *asked[:1],
        {"role": "assistant", "content": [use.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "main.py"}]},
        asked[1],
    ]  # fmt: skip
    reply = await client.beta.messages.create(
        model="claude-sim", max_tokens=50, messages=answered, tools=tools,
        betas=[MID_CONVERSATION],
    )  # fmt: skip
    assert reply.content[0].type == "text" and reply.content[0].text == "Bash returned: main.py"


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        (
            [{"role": "system", "content": "first"}, {"role": "user", "content": "x"}],
            "messages.0: use the top-level `system` parameter for the initial system prompt",
        ),
        (
            [
                {"role": "user", "content": "x"},
                {"role": "system", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
            ],
            "messages.1.content: text-only role `system` messages require",
        ),
    ],
)
async def test_system_messages_have_rules_of_their_own(
    client: anthropic.AsyncAnthropic, messages: list[Any], message: str
) -> None:
    call = client.beta.messages.create(
        model="claude-sim", max_tokens=50, messages=messages, betas=[MID_CONVERSATION]
    )
    assert (await refused(call)).startswith(message)


async def test_count_tokens_matches_the_usage(client: anthropic.AsyncAnthropic) -> None:
    request: JSON = {
        "model": "claude-sim",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "count me in"}],
    }
    counted = await client.messages.count_tokens(**request)
    used = (await client.messages.create(max_tokens=50, **request)).usage
    assert counted.input_tokens == used.input_tokens == count_prompt_tokens(request)


async def test_the_window_rule_speaks_anthropic(
    client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    sim.context_window = 100
    call = client.messages.create(
        model="claude-sim", max_tokens=50, messages=[{"role": "user", "content": "x" * 800}]
    )
    assert await refused(call) == "prompt is too long: 204 tokens > 100 maximum"


async def test_tool_round_trip_responder(client: anthropic.AsyncAnthropic, sim: Simulator) -> None:
    sim.responder = ToolRoundTrip()
    bash = {
        "name": "Bash",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
    history: list[Any] = [{"role": "user", "content": "list the files here"}]
    first = await client.messages.create(
        model="claude-sim", max_tokens=50, messages=history, tools=[bash]
    )
    [call] = first.content
    assert (call.type, call.name, call.input["command"]) == ("tool_use", "Bash", "ls")
    history += [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a.txt\n"}],
        },
    ]
    final = await client.messages.create(
        model="claude-sim", max_tokens=50, messages=history, tools=[bash]
    )
    assert final.content[0].text == "The command listed:\na.txt"
    side = await client.messages.create(model="claude-sim", max_tokens=50, messages=history[:1])
    assert side.content[0].text == "OK."  # no Bash offered: a side query
