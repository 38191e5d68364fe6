"""The ledger of what the agent touched, over real sockets with real SDKs: a session whose
history wrote 12 files is pushed past the compaction trigger, and the simulated summarizer's
own ARTIFACTS names only the first 20 paths it meets (16 files read, then 4 of the 12 written).
The request the proxy sends upstream after the compaction holds all 12 written paths in the
summary's ARTIFACTS section; the next turn (streamed) sends that summary byte for byte; a
second key sending the same session id gets a summary of its own files only.

Claude Code's shapes on Anthropic Messages (Read / Write), Codex's on Responses (exec_command,
apply_patch as a custom tool), a generic agent's on chat (read_file / write_file with `path`).
"""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.pipeline.compaction.sections import section_span
from proxy.pipeline.compaction.summarizer import SYSTEM_PROMPT
from proxy.sim.model import SUMMARY_MAX_ARTIFACTS, summary_reply
from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory

WINDOW = 4_000
GOAL = "Split the parser into modules and keep the tests green."
SUMMARY_HEADER = "[agentproxy] Earlier conversation summarized"
ALICE, BOB = "sk-alice-0001", "sk-bob-0002"
SESSION = {"x-agentproxy-session": "task"}
READS, WRITES, FILLER = 16, 12, 8
OPENED: list[Any] = []


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while OPENED:
        await OPENED.pop().close()


def written(owner: str) -> list[str]:
    return [f"src/{owner}{i}.py" for i in range(WRITES)]


def module(i: int) -> str:
    return f"# module {i}\n" + "x = 1\n" * 230


def source(path: str) -> str:
    return f"def f():\n    return {path!r}\n" * 3


async def start(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, provider: str
) -> tuple[TestServer, Simulator]:
    sim = Simulator(context_window=WINDOW)
    upstream: TestServer = await aiohttp_server(sim.app())
    url = str(upstream.make_url("")).rstrip("/")
    models = "".join(
        f"""
          - model_name: {alias}
            litellm_params: {{model: {provider}/{alias}, api_base: "{url}/v1", api_key: k}}
            model_info: {{max_input_tokens: {WINDOW}}}"""
        for alias in ("sim", "summ")
    )
    config = textwrap.dedent(f"model_list:{models}\n") + textwrap.dedent(
        f"""
        policies:
          - name: p
            compaction: {{summarizer_model: summ}}
        keys:
          api_keys:
            - {{name: alice, key: {ALICE}, team: red}}
            - {{name: bob, key: {BOB}, team: blue}}
        store: {{path: {tmp_path}}}
        """
    )
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config)
    return await start_proxy(path), sim


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def sent_summary(sim: Simulator) -> str:
    """The summary the agent's last request upstream carried (never the summarizer's own)."""
    agent = [r for r in sim.requests if r.body.get("model") != "summ"][-1]
    found = [s for s in strings(agent.body) if s.startswith(SUMMARY_HEADER)]
    assert len(found) == 1, found
    return found[0]


def artifacts(summary: str) -> str:
    span = section_span(summary, "ARTIFACTS")
    assert span is not None, summary
    return summary[span[0] : span[1]]


def summarizer_named(sim: Simulator, paths: list[str]) -> list[str]:
    """Which of `paths` the simulated summarizer's own answer (to its last request, in
    whichever wire it went) named."""
    body = [r for r in sim.requests if r.body.get("model") == "summ"][-1].body
    transcript = next(s for s in strings(body) if s.startswith("Transcript to summarize"))
    asked = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": transcript}]
    limit = body.get("max_tokens") or body.get("max_output_tokens")
    reply = summary_reply(asked, limit)
    assert reply is not None and reply.content
    return [p for p in paths if p in reply.content]


def assert_ledger(first: str, owner: str, other: str) -> None:
    section = artifacts(first)
    for path in written(owner):
        assert path in section, (path, section)
        assert section.count(path) == 1, (path, section)  # named once, never duplicated
    assert f"src/{other}" not in first  # another key's files are not this one's


# --- chat: a generic agent's tools --------------------------------------------------------


def chat_history(owner: str) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]

    def turn(n: int, name: str, text: str, **arguments: Any) -> None:
        function = {"name": name, "arguments": orjson.dumps(arguments).decode()}
        call = {"id": f"c{n}", "type": "function", "function": function}
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": f"c{n}", "content": text})

    for i in range(READS):
        turn(i, "read_file", "notes", path=f"docs/r{i}.md")
    for i, path in enumerate(written(owner)):
        turn(READS + i, "write_file", "ok", path=path, content=source(path))
    for i in range(FILLER):
        turn(100 + i, "read_file", module(i), path=f"lib/big{i}.txt")
    history.append({"role": "user", "content": "Go on with the next module."})
    return history


async def test_chat_a_compaction_keeps_every_written_file_in_the_summarys_artifacts(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy, sim = await start(aiohttp_server, start_proxy, tmp_path, "openai")

    def sdk(key: str) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key=key)
        OPENED.append(client)
        return client

    async def turn(key: str, history: list[dict[str, Any]], stream: bool = False) -> str:
        raw = await sdk(key).chat.completions.with_raw_response.create(
            model="sim",
            messages=history,
            stream=stream,
            extra_headers=SESSION,  # type: ignore[arg-type]
        )
        answer = raw.parse()
        if stream:
            text = "".join([c.choices[0].delta.content or "" async for c in answer if c.choices])  # type: ignore[union-attr]
        else:
            text = answer.choices[0].message.content or ""  # type: ignore[union-attr]
        assert "compaction" in raw.headers["x-agentproxy-applied"]
        return text

    history = chat_history("w")
    answer = await turn(ALICE, history)
    await check_session(
        sim,
        history,
        lambda h: turn(ALICE, h, stream=True),
        lambda h: turn(BOB, h),
        chat_history,
        [{"role": "assistant", "content": answer}, {"role": "user", "content": "Next."}],
    )


async def check_session(
    sim: Simulator,
    history: list[dict[str, Any]],
    alice_streamed: Callable[[list[dict[str, Any]]], Any],
    bob: Callable[[list[dict[str, Any]]], Any],
    history_of: Callable[[str], list[dict[str, Any]]],
    more: list[dict[str, Any]],
) -> None:
    """After alice's first turn compacted: her summary holds all 12 paths; her next turn
    (streamed) sends it byte for byte; bob's own compaction under the same session id holds
    his files, not hers; and alice's summary is still what it was."""
    first = sent_summary(sim)
    named = summarizer_named(sim, written("w"))
    assert 0 < len(named) < WRITES  # the summarizer alone names fewer than 12 ...
    assert len(named) == SUMMARY_MAX_ARTIFACTS - READS
    assert_ledger(first, "w", "b")  # ... the summary sent names all 12
    await alice_streamed([*history, *more])
    assert sent_summary(sim) == first  # the checkpoint, byte for byte
    await bob(history_of("b"))
    assert_ledger(sent_summary(sim), "b", "w")
    await alice_streamed([*history, *more])
    assert sent_summary(sim) == first


# --- Anthropic Messages: Claude Code's tools ----------------------------------------------


def claude_history(owner: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]

    def turn(n: int, name: str, text: str, **arguments: Any) -> None:
        use = {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": arguments}
        messages.append({"role": "assistant", "content": [use]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": text}
        messages.append({"role": "user", "content": [result]})

    for i in range(READS):
        turn(i, "Read", "notes", file_path=f"docs/r{i}.md")
    for i, path in enumerate(written(owner)):
        turn(READS + i, "Write", "ok", file_path=path, content=source(path))
    for i in range(FILLER):
        turn(100 + i, "Read", module(i), file_path=f"lib/big{i}.txt")
    messages[-1]["content"].append({"type": "text", "text": "Go on with the next module."})
    return messages


async def test_anthropic_a_compaction_keeps_every_written_file_in_the_summarys_artifacts(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy, sim = await start(aiohttp_server, start_proxy, tmp_path, "anthropic")
    base = str(proxy.make_url("")).rstrip("/")

    async def turn(key: str, messages: list[dict[str, Any]], stream: bool = False) -> str:
        client = anthropic.AsyncAnthropic(base_url=base, api_key=key, max_retries=0)
        OPENED.append(client)
        if stream:
            async with client.messages.stream(
                model="sim",
                max_tokens=256,
                messages=messages,
                extra_headers=SESSION,  # type: ignore[arg-type]
            ) as events:
                return await events.get_final_text()
        raw = await client.messages.with_raw_response.create(
            model="sim",
            max_tokens=256,
            messages=messages,
            extra_headers=SESSION,  # type: ignore[arg-type]
        )
        assert "compaction" in raw.headers["x-agentproxy-applied"]
        return "".join(b.text for b in (await raw.parse()).content if b.type == "text")

    history = claude_history("w")
    answer = await turn(ALICE, history)
    await check_session(
        sim,
        history,
        lambda h: turn(ALICE, h, stream=True),
        lambda h: turn(BOB, h),
        claude_history,
        [{"role": "assistant", "content": answer or "ok"}, {"role": "user", "content": "Next."}],
    )


# --- Responses: Codex's tools --------------------------------------------------------------


def codex_input(owner: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    for i in range(READS):
        command = orjson.dumps({"cmd": f"cat docs/r{i}.md"}).decode()
        items.append({"type": "function_call", "call_id": f"c{i}", "name": "exec_command",
                      "arguments": command})  # fmt: skip
        items.append({"type": "function_call_output", "call_id": f"c{i}", "output": "notes"})
    for i, path in enumerate(written(owner)):
        lines = "".join(f"+{line}\n" for line in source(path).splitlines())
        patch = f"*** Begin Patch\n*** Add File: {path}\n{lines}*** End Patch\n"
        n = READS + i
        items.append({"type": "custom_tool_call", "call_id": f"c{n}", "name": "apply_patch",
                      "input": patch})  # fmt: skip
        items.append({"type": "custom_tool_call_output", "call_id": f"c{n}", "output": "Done!"})
    for i in range(FILLER):
        arguments = orjson.dumps({"command": ["bash", "-lc", f"cat lib/big{i}.txt"]}).decode()
        items.append({"type": "function_call", "call_id": f"b{i}", "name": "shell",
                      "arguments": arguments})  # fmt: skip
        items.append({"type": "function_call_output", "call_id": f"b{i}", "output": module(i)})
    items.append({"role": "user", "content": "Go on with the next module."})
    return items


async def test_responses_a_compaction_keeps_every_written_file_in_the_summarys_artifacts(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy, sim = await start(aiohttp_server, start_proxy, tmp_path, "openai")

    async def turn(key: str, items: list[dict[str, Any]], stream: bool = False) -> str:
        client = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key=key, max_retries=0)
        OPENED.append(client)
        raw = await client.responses.with_raw_response.create(
            model="sim",
            input=items,
            stream=stream,
            extra_headers=SESSION,  # type: ignore[arg-type]
        )
        answer = raw.parse()
        assert "compaction" in raw.headers["x-agentproxy-applied"]
        if stream:
            deltas = [e async for e in answer if e.type == "response.output_text.delta"]  # type: ignore[union-attr]
            return "".join(e.delta for e in deltas)
        return answer.output_text  # type: ignore[union-attr]

    items = codex_input("w")
    answer = await turn(ALICE, items)
    await check_session(
        sim,
        items,
        lambda h: turn(ALICE, h, stream=True),
        lambda h: turn(BOB, h),
        codex_input,
        [{"role": "assistant", "content": answer}, {"role": "user", "content": "Next."}],
    )
    # Codex's commands are in the ledger too: the latest, in order.
    assert "- `cat lib/big0.txt`" in artifacts(sent_summary(sim))
