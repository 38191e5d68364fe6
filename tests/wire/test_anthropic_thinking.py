"""Thinking a client dropped, put back: the `anthropic` SDK through the real proxy to the strict
Anthropic twin over real sockets, answers plain and streamed. The twin refuses a tool loop
whose assistant turn lost its thinking (with thinking on) and any block it did not sign."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from aiohttp.test_utils import TestServer

from proxy.sessions.turn_memory import TurnMemory
from proxy.sim.simulator import Simulator
from proxy.sim.thinking import REDACTED_TRIGGER
from proxy.wire.anthropic.thinking import ANSWERS_PER_SESSION, loop_start, remember, remembered
from tests.conftest import ProxyFactory

KEY, OTHER_KEY = "sk-proxy-thinking-1", "sk-proxy-thinking-2"
UPSTREAM_KEY = "sk-sim-upstream-secret"
TOOLS: list[Any] = [
    {
        "name": "read_file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
ASK = {"role": "user", "content": 'read_file({"path": "notes.txt"})'}
ADAPTIVE = {"type": "adaptive"}
# What Claude Code sends with every request: this edit needs thinking on.
CLEAR_THINKING = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
SESSION = {"x-agentproxy-session": "shared-session-id"}


@pytest.fixture
def sim() -> Simulator:
    return Simulator(api_key=UPSTREAM_KEY)


@pytest.fixture
async def proxy(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, sim: Simulator
) -> TestServer:
    upstream = await aiohttp_server(sim.app())
    config = f"""\
        store: {{path: {tmp_path / "state"}}}
        keys:
          api_keys: [{{name: one, key: {KEY}}}, {{name: two, key: {OTHER_KEY}}}]
        model_list:
          - model_name: claude
            litellm_params:
              model: anthropic/claude-sim
              api_base: {str(upstream.make_url("")).rstrip("/")}
              api_key: {UPSTREAM_KEY}
        """
    path = tmp_path / "thinking.yaml"
    path.write_text(textwrap.dedent(config))
    return await start_proxy(path)


@pytest.fixture
async def sdks(proxy: TestServer) -> AsyncIterator[dict[str, anthropic.AsyncAnthropic]]:
    url = str(proxy.make_url("")).rstrip("/")
    made = {
        key: anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)
        for key in (KEY, OTHER_KEY)
    }
    yield made
    for sdk in made.values():
        await sdk.close()


async def ask(
    sdk: anthropic.AsyncAnthropic, messages: list[Any], stream: bool, **extra: Any
) -> tuple[Any, str]:
    """The answer and the proxy's x-agentproxy-applied header, streamed or not."""
    fields: dict[str, Any] = {
        "model": "claude",
        "max_tokens": 2048,
        "thinking": ADAPTIVE,
        "tools": TOOLS,
        "messages": messages,
        "extra_headers": SESSION,
    }
    if "context_management" in extra:  # not a field of the SDK's (non-beta) create
        fields["extra_body"] = {"context_management": extra.pop("context_management")}
    fields |= extra
    if stream:
        async with sdk.messages.stream(**fields) as events:
            message = await events.get_final_message()
            return message, events.response.headers.get("x-agentproxy-applied", "")
    raw = await sdk.messages.with_raw_response.create(**fields)
    return await raw.parse(), raw.headers.get("x-agentproxy-applied", "")


def dropped_history(first: Any) -> tuple[list[Any], list[Any]]:
    """The history after `first` (a tool_use answer) as a client that drops thinking sends
    it, and the assistant message as the provider answered it."""
    content = [block.model_dump(exclude_none=True) for block in first.content]
    call = next(b for b in content if b["type"] == "tool_use")
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "milk"}
    kept = [b for b in content if b["type"] not in ("thinking", "redacted_thinking")]
    history = [ASK, {"role": "assistant", "content": kept}, {"role": "user", "content": [result]}]
    return history, content


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_dropped_thinking_is_put_back_as_it_was_relayed(
    sdks: dict[str, anthropic.AsyncAnthropic], sim: Simulator, stream: bool
) -> None:
    sdk = sdks[KEY]
    first, _ = await ask(sdk, [ASK], stream, context_management=CLEAR_THINKING)
    assert first.content[0].type == "thinking" and first.content[0].signature
    history, relayed = dropped_history(first)

    final, applied = await ask(sdk, history, stream, context_management=CLEAR_THINKING)

    assert final.content[-1].text == "read_file returned: milk"
    sent = sim.requests[-1].body
    assert sent["messages"][1]["content"] == relayed  # thinking first, signature intact
    assert sent["thinking"] == ADAPTIVE and sent["context_management"] == CLEAR_THINKING
    assert "repair.restored_thinking;count=1" in applied
    # The next turn sends the same history on: it is put back again, the same bytes.
    more = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "hi"}]
    await ask(sdk, more, stream)
    assert sim.requests[-1].body["messages"][1]["content"] == relayed


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_with_nothing_to_put_back_thinking_is_off_for_that_turn_only(
    sdks: dict[str, anthropic.AsyncAnthropic], sim: Simulator, stream: bool
) -> None:
    """The same session id under another key reads nothing of the first key's thinking
    (owned): its turn goes without thinking, and the next turn has it on again."""
    first, _ = await ask(sdks[KEY], [ASK], stream)
    history, _ = dropped_history(first)

    final, applied = await ask(sdks[OTHER_KEY], history, stream, context_management=CLEAR_THINKING)

    assert final.content[-1].text == "read_file returned: milk"
    sent = sim.requests[-1].body
    assert "thinking" not in sent["messages"][1]["content"][0]["type"]
    assert "thinking" not in sent and "context_management" not in sent
    assert "repair.disabled_thinking" in applied and "restored_thinking" not in applied
    again, _ = await ask(sdks[OTHER_KEY], [ASK], stream)
    assert again.content[0].type == "thinking" and sim.requests[-1].body["thinking"] == ADAPTIVE


async def test_a_client_that_keeps_its_thinking_is_left_alone(
    sdks: dict[str, anthropic.AsyncAnthropic], sim: Simulator
) -> None:
    first, _ = await ask(sdks[KEY], [ASK], False)
    _, relayed = dropped_history(first)
    history, _ = dropped_history(first)
    history[1] = {"role": "assistant", "content": relayed}
    _, applied = await ask(sdks[KEY], history, False)
    assert "thinking" not in applied
    assert sim.requests[-1].body["messages"][1]["content"] == relayed


def test_the_memory_keeps_the_last_answers_within_its_bytes() -> None:
    memory = TurnMemory(max_bytes=100_000)
    for n in range(ANSWERS_PER_SESSION + 4):
        thinking = {"type": "thinking", "thinking": "plan", "signature": f"sig{n}"}
        remember(memory, "key:one", "s", [thinking, {"type": "tool_use", "id": f"toolu_{n}"}])
    kept = remembered(memory, "key:one", "s")
    assert len(kept) == ANSWERS_PER_SESSION and "toolu_0" not in kept
    assert remembered(memory, "key:two", "s") == {}  # another owner's session of the same name
    remember(memory, "key:one", "s", [{"type": "text", "text": "no tool called"}])
    assert "toolu_19" in remembered(memory, "key:one", "s")
    huge = {"type": "thinking", "thinking": "x" * 200_000, "signature": "s"}
    remember(memory, "key:one", "big", [huge, {"type": "tool_use", "id": "toolu_big"}])
    assert remembered(memory, "key:one", "big") == {}  # larger than the whole memory: not kept


def test_a_turn_and_the_thinking_relayed_to_it_are_kept_apart() -> None:
    """A session's next turn leaves the thinking relayed to it, and the reverse; the bytes of
    both count against the one bound."""
    memory = TurnMemory(max_bytes=100_000)
    thinking = {"type": "thinking", "thinking": "plan", "signature": "sig"}
    remember(memory, "key:one", "s", [thinking, {"type": "tool_use", "id": "toolu_1"}])
    turn = {"the": "turn"}
    memory.keep("key:one", "s", turn, 1_000)
    assert "toolu_1" in remembered(memory, "key:one", "s")
    remember(memory, "key:one", "s", [thinking, {"type": "tool_use", "id": "toolu_2"}])
    assert memory.recall("key:one", "s", dict) is turn
    assert memory.recall("key:two", "s", dict) is None
    memory.keep("key:one", "s", {"a": "turn"}, 100_000)  # too large beside the thinking
    assert memory.recall("key:one", "s", dict) is turn and remembered(memory, "key:one", "s")


def test_the_loop_start_seen_incrementally_is_the_loop_start() -> None:
    """Every split of a history into a part looked at and new messages finds the same start
    of the tool loop as a walk over all of it."""

    def call(n: int) -> Any:
        return {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{n}"}]}

    def result(n: int) -> Any:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{n}"}]}

    text = {"role": "user", "content": "go"}
    system = {"role": "system", "content": "note"}
    histories = [
        [text, call(1), result(1), call(2), result(2)],
        [text, call(1), result(1), system, call(2), result(2), call(3), result(3)],
        [text, call(1), result(1), {"role": "assistant", "content": "done"}, text],
        [text, {"role": "assistant", "content": "hm"}, text, call(1), result(1)],
        [text, call(1), result(1), text, call(2), result(2)],
    ]
    for messages in histories:
        whole = loop_start(messages)
        for floor in range(1, len(messages) + 1):
            before = loop_start(messages[:floor])
            assert loop_start(messages, floor, before) == whole, (messages, floor)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_dropped_redacted_thinking_block_is_put_back_too(
    sdks: dict[str, anthropic.AsyncAnthropic], sim: Simulator, stream: bool
) -> None:
    ask_redacted = {"role": "user", "content": f'{REDACTED_TRIGGER} read_file({{"path": "a"}})'}
    first, _ = await ask(sdks[KEY], [ask_redacted], stream)
    assert first.content[0].type == "redacted_thinking"
    history, relayed = dropped_history(first)
    history[0] = ask_redacted
    final, applied = await ask(sdks[KEY], history, stream)
    assert final.content[-1].type == "text" and "repair.restored_thinking" in applied
    assert sim.requests[-1].body["messages"][1]["content"] == relayed


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    "session", [{}, {"x-agentproxy-session": KEY}], ids=["fingerprinted", "named-as-its-key"]
)
async def test_thinking_is_put_back_whatever_name_the_session_is_kept_under(
    sdks: dict[str, anthropic.AsyncAnthropic], stream: bool, session: dict[str, str]
) -> None:
    """A session the client names by no id, or by its API key (kept under another name, so
    the key is never a session's name): its relayed thinking is read where it was written."""
    sdk = sdks[KEY]
    first, _ = await ask(sdk, [ASK], stream, extra_headers=session)
    history, _ = dropped_history(first)
    _, applied = await ask(sdk, history, stream, extra_headers=session)
    assert "repair.restored_thinking;count=1" in applied, applied
