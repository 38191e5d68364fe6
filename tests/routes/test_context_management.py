"""Anthropic `context_management` through the real proxy with the `anthropic` SDK, over real
sockets, plain and streamed: passed through (with its beta header) to an Anthropic deployment,
whose simulator applies it and reports its applied edits; carried out by the proxy for an
OpenAI chat deployment (cleared results archived and read back by recall, the edits reported
as Anthropic does); compaction blocks written and sent back; and the proxy's own compaction
yielding to the client's unless the policy overrides (`compaction.client_managed`)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.model import SUMMARY_MAX_ARTIFACTS
from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory
from tests.routes.test_anthropic import client, close_clients  # noqa: F401 - its fixture too
from tests.support.scrape import metrics_of, sample

KEY = "sk-proxy-context-1"
OTHER_KEY = "sk-proxy-context-2"
UPSTREAM_KEY = "sk-sim-upstream-secret"
TOOLS: list[Any] = [
    {
        "name": "read_file",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
    {
        "name": "memory",
        "description": "Notes",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
]
CLEAR = {
    "type": "clear_tool_uses_20250919",
    "trigger": {"type": "input_tokens", "value": 100},
    "keep": {"type": "tool_uses", "value": 1},
}
COMPACT = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 500}}


def history(uses: int = 3, size: int = 2000, tool: str = "read_file") -> list[Any]:
    """A conversation with `uses` tool calls, each answered by a result of `size` chars."""
    messages: list[Any] = [{"role": "user", "content": "Read the files one by one."}]
    for i in range(uses):
        name = "memory" if tool == "memory" and i == 0 else "read_file"
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {"path": f"f{i}"}}
        text = f"file {i} line: the secret of file {i} is CODE{i}\n" * (size // 40)
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": text}
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": "Reading."}, call]},
            {"role": "user", "content": [result]},
        ]
    messages[-1]["content"].append({"type": "text", "text": "now say done"})
    return messages


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, policies: str = ""
) -> TestServer:
    url = str(upstream.make_url("")).rstrip("/")
    text = f"""\
        store: {{path: {tmp_path / "state"}}}
        keys:
          api_keys: [{{name: agent, key: {KEY}}}, {{name: other, key: {OTHER_KEY}}}]
        model_list:
          - model_name: claude
            litellm_params:
              model: anthropic/claude-sim
              api_base: {url}
              api_key: {UPSTREAM_KEY}
            model_info:
              max_input_tokens: 200000
          - model_name: gpt
            litellm_params:
              model: openai/sim
              api_base: {url}/v1
              api_key: {UPSTREAM_KEY}
            model_info:
              max_input_tokens: 200000
        """
    path = tmp_path / "context.yaml"
    path.write_text(textwrap.dedent(text) + textwrap.dedent(policies))
    return await start_proxy(path)


@pytest.fixture
def sim() -> Simulator:
    return Simulator(api_key=UPSTREAM_KEY)


@pytest.fixture
async def proxy(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, sim: Simulator
) -> TestServer:
    return await start(start_proxy, tmp_path, await aiohttp_server(sim.app()))


async def ask(
    proxy: TestServer,
    model: str,
    stream: bool,
    messages: list[Any],
    key: str = KEY,
    **fields: Any,
) -> tuple[Any, dict[str, str]]:
    """The answer (a BetaMessage) and the response headers, plain or streamed."""
    sdk = client(proxy, key)
    fields.setdefault("tools", TOOLS)
    if stream:
        async with sdk.beta.messages.stream(
            model=model, max_tokens=256, messages=messages, **fields
        ) as events:
            async for _ in events:
                pass
            headers = dict(events.response.headers)
            return await events.get_final_message(), headers
    raw = await sdk.beta.messages.with_raw_response.create(
        model=model, max_tokens=256, messages=messages, **fields
    )
    return await raw.parse(), dict(raw.headers)


async def edits_counted(proxy: TestServer, edit: str, source: str) -> float:
    text = await metrics_of(proxy)
    return sample(text, "agentproxy_context_edits_total", edit=edit, source=source)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_anthropic_deployment_gets_it_with_its_beta_and_reports_its_edits(
    proxy: TestServer, sim: Simulator, stream: bool
) -> None:
    message, _ = await ask(
        proxy, "claude", stream, history(), context_management={"edits": [CLEAR]}
    )
    sent = sim.requests[-1]
    assert sent.body["context_management"] == {"edits": [CLEAR]}  # as the client sent it
    assert "context-management-2025-06-27" in sent.headers["anthropic-beta"]
    edits = message.context_management.applied_edits  # the provider's, passed back as is
    assert [(e.type, e.cleared_tool_uses) for e in edits] == [("clear_tool_uses_20250919", 2)]
    assert await edits_counted(proxy, "clear_tool_uses", "provider") == 1


async def test_the_beta_is_added_to_those_the_client_sent(
    proxy: TestServer, sim: Simulator
) -> None:
    await ask(
        proxy,
        "claude",
        False,
        history(),
        context_management={"edits": [CLEAR, {"type": "compact_20260112"}]},
        betas=["interleaved-thinking-2025-05-14"],
    )
    betas = sim.requests[-1].headers["anthropic-beta"].split(",")
    assert betas == [
        "interleaved-thinking-2025-05-14",
        "context-management-2025-06-27",
        "compact-2026-01-12",
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_deployment_has_the_edits_carried_out_by_the_proxy(
    proxy: TestServer, sim: Simulator, stream: bool
) -> None:
    message, headers = await ask(
        proxy, "gpt", stream, history(), context_management={"edits": [CLEAR]}
    )
    sent = sim.requests[-1]
    assert sent.path == "/v1/chat/completions"
    results = [m["content"] for m in sent.body["messages"] if m["role"] == "tool"]
    assert "cleared from the context" in results[0] and "cleared from the context" in results[1]
    assert "CODE2" in results[2]  # the most recent tool use is kept
    edits = message.context_management.applied_edits
    assert [(e.type, e.cleared_tool_uses) for e in edits] == [("clear_tool_uses_20250919", 2)]
    assert edits[0].cleared_input_tokens > 500
    assert "context_edits.cleared_tool_uses;count=2" in headers["x-agentproxy-applied"]
    assert await edits_counted(proxy, "clear_tool_uses", "client") == 1
    # Archived first: the cleared result reads back by its reference.
    ref = re.search(r"reference: (ap_\w+)", results[0]).group(1)  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as http:
        url = str(proxy.make_url(f"/v1/agentproxy/archive/{ref}"))
        async with http.get(url, headers={"x-api-key": KEY}) as r:
            assert r.status == 200 and "CODE0" in (await r.json())["content"]


async def test_the_same_history_clears_to_the_same_bytes(proxy: TestServer, sim: Simulator) -> None:
    for _ in range(2):
        await ask(proxy, "gpt", False, history(), context_management={"edits": [CLEAR]})
    first, second = (r.body["messages"] for r in sim.requests[-2:])
    assert first == second


async def test_excluded_tools_under_the_trigger_and_clear_at_least_are_honoured(
    proxy: TestServer, sim: Simulator
) -> None:
    excluded = {**CLEAR, "exclude_tools": ["memory"], "clear_tool_inputs": True}
    message, _ = await ask(
        proxy, "gpt", False, history(tool="memory"), context_management={"edits": [excluded]}
    )
    sent = sim.requests[-1].body["messages"]
    results = [m["content"] for m in sent if m["role"] == "tool"]
    assert "CODE0" in results[0] and "cleared" in results[1]  # memory's use stays
    calls = [c for m in sent if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert calls[0]["function"]["arguments"] == '{"path":"f0"}'
    assert "input cleared" in calls[1]["function"]["arguments"]
    assert message.context_management.applied_edits[0].cleared_tool_uses == 1
    high = {**CLEAR, "trigger": {"type": "input_tokens", "value": 1_000_000}}
    least = {**CLEAR, "clear_at_least": {"type": "input_tokens", "value": 1_000_000}}
    for edit in (high, least):
        message, _ = await ask(proxy, "gpt", False, history(), context_management={"edits": [edit]})
        assert all("cleared" not in str(m["content"]) for m in sim.requests[-1].body["messages"])
        assert message.context_management.applied_edits == []


async def test_recall_reads_a_cleared_result_back(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    def recalling(body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]
        if last.get("role") == "tool" and last.get("tool_call_id") == "call_r1":
            return {"role": "assistant", "content": f"FOUND: {str(last['content'])[:33]}"}
        cleared = next(m for m in body["messages"] if "cleared from" in str(m.get("content")))
        ref = re.search(r"reference: (ap_\w+)", cleared["content"]).group(1)  # type: ignore[union-attr]
        function = {"name": "agentproxy_recall", "arguments": f'{{"ref": "{ref}"}}'}
        call = {"id": "call_r1", "type": "function", "function": function}
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    sim = Simulator(api_key=UPSTREAM_KEY, responder=recalling)
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()))
    message, _ = await ask(proxy, "gpt", False, history(), context_management={"edits": [CLEAR]})
    assert message.content[-1].text.startswith("FOUND: file 0 line: the secret of")


async def test_claude_codes_own_edit_works_on_every_deployment(
    proxy: TestServer, sim: Simulator
) -> None:
    """Claude Code sends clear_thinking with keep "all" and adaptive thinking on every turn."""
    keep_all = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    for model in ("claude", "gpt"):
        for stream in (False, True):
            message, headers = await ask(
                proxy, model, stream, [{"role": "user", "content": "hello"}],
                context_management=keep_all, thinking={"type": "adaptive"},
            )  # fmt: skip
            assert message.content[-1].type == "text"
            assert message.context_management.applied_edits == []
            assert "compaction.yielded" not in headers.get("x-agentproxy-applied", "")


async def test_clear_thinking_is_reported_for_a_chat_deployment(
    proxy: TestServer, sim: Simulator
) -> None:
    messages = history(uses=3)
    for n, message in enumerate(messages):
        if message["role"] == "assistant":
            thinking = {"type": "thinking", "thinking": "hmm " * 50, "signature": f"s{n}"}
            message["content"] = [thinking, *message["content"]]
    edit = {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
    answer, _ = await ask(proxy, "gpt", False, messages, context_management={"edits": [edit]})
    [applied] = answer.context_management.applied_edits
    assert (applied.type, applied.cleared_thinking_turns) == ("clear_thinking_20251015", 2)
    assert applied.cleared_input_tokens == 100


@pytest.mark.parametrize("stream", [False, True])
async def test_a_compaction_is_written_by_the_proxy_and_sent_back_as_the_new_start(
    proxy: TestServer, sim: Simulator, stream: bool
) -> None:
    compact = {"edits": [COMPACT]}
    messages = history()
    message, headers = await ask(proxy, "gpt", stream, messages, context_management=compact)
    block = message.content[0]
    assert block.type == "compaction" and block.content
    assert "context_edits.compacted" in headers["x-agentproxy-applied"]
    assert await edits_counted(proxy, "compaction", "client") == 1
    compacted = sim.requests[-1].body["messages"]  # the summarizer's call came before
    assert len(compacted) == 1 and block.content in compacted[0]["content"]
    # The next turn sends the block back: the history starts there, as a summary message.
    turn = [b.model_dump(exclude_none=True) for b in message.content if b.type != "tool_use"]
    later = [*messages, {"role": "assistant", "content": turn},
             {"role": "user", "content": "and now?"}]  # fmt: skip
    for model in ("gpt", "claude"):
        await ask(proxy, model, stream, later, context_management=compact)
        sent = sim.requests[-1].body["messages"]
        if model == "gpt":
            assert sent[0]["content"] == compacted[0]["content"]  # the same bytes as before
            assert sent[-1] == {"role": "user", "content": "and now?"}
            assert len(sent) == len(turn) + 1  # nothing from before the compaction
        else:  # Anthropic's own API gets the client's history as sent: it drops the rest
            assert sent == later


async def test_the_simulator_serves_compaction_natively(proxy: TestServer, sim: Simulator) -> None:
    compact = {"edits": [COMPACT]}
    for stream in (False, True):
        message, _ = await ask(proxy, "claude", stream, history(), context_management=compact)
        assert message.content[0].type == "compaction"
        assert message.content[0].content.startswith("Summary of the 7 messages")
    assert await edits_counted(proxy, "compaction", "client") == 0


async def test_a_malformed_context_management_is_a_400_naming_the_field(
    proxy: TestServer,
) -> None:
    bad = {"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "turns", "value": 1}}]}
    with pytest.raises(anthropic.BadRequestError) as caught:
        await ask(proxy, "gpt", False, history(), context_management=bad)
    assert "context_management.edits.0.keep.type" in str(caught.value)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await ask(proxy, "gpt", False, history(), context_management={"edits": [{"type": "x"}]})
    assert "does not match any of the expected tags" in str(caught.value)


POLICY = """\
    policies:
      - name: tight
        compaction: {{trigger: 0.5, target: 0.3, keep_messages: 2, prepare_at: null,
                     client_managed: {mode}}}
    """


@pytest.mark.parametrize("mode", ["honour", "override"])
async def test_the_proxys_compaction_yields_to_the_clients_unless_overridden(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, mode: str
) -> None:
    sim = Simulator(api_key=UPSTREAM_KEY)
    upstream = await aiohttp_server(sim.app())
    proxy = await start(start_proxy, tmp_path, upstream, textwrap.dedent(POLICY.format(mode=mode)))
    # A window the history is well past the trigger of: the proxy's compaction would cut it.
    path = tmp_path / "context.yaml"
    path.write_text(path.read_text().replace("200000", "3000"))
    proxy = await start_proxy(path)
    quiet = {**CLEAR, "trigger": {"type": "input_tokens", "value": 10_000_000}}
    _, headers = await ask(proxy, "gpt", False, history(), context_management={"edits": [quiet]})
    applied = headers.get("x-agentproxy-applied", "")
    if mode == "honour":
        assert "compaction.yielded" in applied
        sent = sim.requests[-1].body["messages"]  # the client's history, whole
        assert len(sent) == 8 and "[agentproxy]" not in str(sent)
    else:
        assert "compaction.yielded" not in applied
        assert "compaction.summarized" in applied or "compaction.middle_out" in applied
    # Without the client's instructions the proxy compacts as always.
    _, headers = await ask(proxy, "gpt", False, history())
    assert "compaction.yielded" not in headers.get("x-agentproxy-applied", "")


async def test_pausing_after_a_compaction_answers_with_the_block_alone(
    proxy: TestServer, sim: Simulator
) -> None:
    compact = {"edits": [{**COMPACT, "pause_after_compaction": True}]}
    message, _ = await ask(proxy, "gpt", False, history(), context_management=compact)
    assert [b.type for b in message.content] == ["compaction"]
    assert message.stop_reason == "compaction"


async def test_an_overflow_is_still_recovered_from_while_honouring_the_client(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    sim = Simulator(api_key=UPSTREAM_KEY, context_window=2000)
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()))
    quiet = {**CLEAR, "trigger": {"type": "input_tokens", "value": 10_000_000}}
    message, headers = await ask(
        proxy, "gpt", False, history(uses=4), context_management={"edits": [quiet]}
    )
    assert message.content[-1].type in ("text", "tool_use")
    applied = headers["x-agentproxy-applied"]
    assert "compaction.summarized" in applied or "compaction.middle_out" in applied
    assert sim.requests[0].status == 400  # overflowed, then compacted and retried
    assert sim.requests[-1].status == 200


async def test_a_cleared_result_is_its_owners_alone(proxy: TestServer, sim: Simulator) -> None:
    """Two keys send the same session id and history: each clears into its own archive."""
    refs = []
    for key in (KEY, OTHER_KEY):
        await ask(
            proxy, "gpt", False, history(), key=key, context_management={"edits": [CLEAR]},
            extra_headers={"x-agentproxy-session": "shared-name"},
        )  # fmt: skip
        tool = next(m for m in sim.requests[-1].body["messages"] if m["role"] == "tool")
        refs.append(re.search(r"reference: (ap_\w+)", tool["content"]).group(1))  # type: ignore[union-attr]
    assert refs[0] != refs[1]
    async with aiohttp.ClientSession() as http:
        url = str(proxy.make_url(f"/v1/agentproxy/archive/{refs[0]}"))
        async with http.get(url, headers={"x-api-key": OTHER_KEY}) as r:
            assert r.status == 404
        async with http.get(url, headers={"x-api-key": KEY}) as r:
            assert r.status == 200


async def test_a_compaction_the_client_asked_for_names_every_file_it_wrote(
    proxy: TestServer, sim: Simulator
) -> None:
    """The ledger of touched files (issue 38, item 5) reaches the client's own compactions too:
    every file the history wrote is in the compaction block, whatever the summarizer wrote (the
    simulated one names the first SUMMARY_MAX_ARTIFACTS paths it meets)."""
    written = SUMMARY_MAX_ARTIFACTS + 12
    messages: list[Any] = [{"role": "user", "content": "Write the modules."}]
    for i in range(written):
        arguments = {"file_path": f"src/written_{i}.py", "content": "x = 1\n" * 60}
        call = {"type": "tool_use", "id": f"toolu_w{i}", "name": "Write", "input": arguments}
        done = {"type": "tool_result", "tool_use_id": f"toolu_w{i}", "content": "written"}
        messages += [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [done]},
        ]
    messages[-1]["content"].append({"type": "text", "text": "now say done"})
    message, _ = await ask(proxy, "gpt", False, messages, context_management={"edits": [COMPACT]})
    block = message.content[0]
    assert block.type == "compaction"
    assert all(f"src/written_{i}.py" in block.content for i in range(written)), block.content
