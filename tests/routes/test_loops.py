"""Loop detection through the real proxy, over real sockets: a scripted agent that repeats one
call forever meets the ladder warn → no_tools → block."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory, base_url, sim_config

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
ARGUMENTS = '{"path": "missing.txt"}'
SESSION = {"x-agentproxy-session": "stuck-agent"}


def stubborn_model(body: dict[str, Any]) -> dict[str, Any]:
    """Always reads the same file again, unless the request forbids tools."""
    if body.get("tool_choice") == "none":
        return {"role": "assistant", "content": "I cannot read missing.txt; it does not exist."}
    turn = len(body["messages"])
    function = {"name": "read_file", "arguments": ARGUMENTS}
    call = {"id": f"call_{turn}", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, policies: str = ""
) -> TestServer:
    path = tmp_path / "c.yaml"
    extra = f"store: {{path: {tmp_path / 'state'}}}\n{textwrap.dedent(policies)}"
    path.write_text(sim_config(str(upstream.make_url("")).rstrip("/"), extra))
    return await start_proxy(path)


class Agent:
    """Plays the agent: sends its history, runs every call it gets back (the result never
    changes) and appends both, turn after turn."""

    def __init__(self, proxy: TestServer, stream: bool, headers: dict[str, str]) -> None:
        self.proxy = proxy
        self.stream = stream
        self.headers = headers
        self.history: list[dict[str, Any]] = [{"role": "user", "content": "Summarize notes."}]
        self.applied: list[str] = []

    async def turn(self, client: openai.AsyncOpenAI) -> dict[str, Any]:
        raw = await client.chat.completions.with_raw_response.create(
            model="sim",
            messages=self.history,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            stream=self.stream,
            extra_headers=self.headers,
        )
        self.applied.append(raw.headers.get("x-agentproxy-applied", ""))
        message = await self._message(raw.parse())
        self.history.append(message)
        for call in message.get("tool_calls") or []:
            self.history.append({"role": "tool", "tool_call_id": call["id"], "content": "ENOENT"})
        return message

    async def _message(self, parsed: Any) -> dict[str, Any]:
        if not self.stream:
            message: dict[str, Any] = parsed.choices[0].message.model_dump(exclude_none=True)
            return message
        content, calls = "", dict[int, dict[str, Any]]()
        async for chunk in parsed:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for part in delta.tool_calls or []:
                call = calls.setdefault(
                    part.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] += part.id or ""
                call["function"]["name"] += part.function.name or ""
                call["function"]["arguments"] += part.function.arguments or ""
        if calls:
            return {"role": "assistant", "content": None, "tool_calls": list(calls.values())}
        return {"role": "assistant", "content": content}


def client(proxy: TestServer, max_retries: int = 0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused", max_retries=max_retries)


async def metrics_text(proxy: TestServer) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(str(proxy.make_url("/metrics"))) as response:
            return await response.text()


def blocks_counted(metrics: str) -> float:
    found = re.search(r'agentproxy_decisions_total\{action="block",guard="loops"\} (\S+)', metrics)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_repeating_agent_is_warned_then_denied_tools_then_blocked(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, stream: bool
) -> None:
    sim = Simulator(responder=stubborn_model)
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()))
    agent = Agent(proxy, stream, SESSION)
    sdk = client(proxy)

    for _ in range(3):  # two calls so far: not yet a loop
        await agent.turn(sdk)
    assert not any("loops." in applied for applied in agent.applied)
    assert len(sim.requests) == 3

    # Third identical call in the history: the model is told, and answers as it likes.
    message = await agent.turn(sdk)
    assert "loops.warn" in agent.applied[-1]
    sent = sim.requests[-1].body
    assert sent["messages"][:-1] == agent.history[:-2]  # the agent's history, then the note
    assert sent["messages"][-1] == {
        "role": "user",
        "content": "[agentproxy] You have called read_file with the same arguments 3 times in "
        f"your last 3 calls ({ARGUMENTS}); its result will not change. Try something "
        "different or explain what is blocking you.",
    }
    assert "tool_choice" not in sent
    assert message["tool_calls"]  # the stubborn model calls again

    # Fourth: tools are off for this reply, so the model has to answer in words.
    message = await agent.turn(sdk)
    assert "loops.no_tools" in agent.applied[-1]
    sent = sim.requests[-1].body
    assert sent["tool_choice"] == "none"
    assert sent["messages"][-1]["content"].endswith("answer in words.")
    assert message["content"] == "I cannot read missing.txt; it does not exist."
    assert not message.get("tool_calls")

    # The user says go on; the model's last message made no call, so nothing is judged.
    agent.history.append({"role": "user", "content": "Try again."})
    await agent.turn(sdk)
    assert "loops." not in agent.applied[-1]
    assert "tool_choice" not in sim.requests[-1].body
    upstream_calls = len(sim.requests)

    # It reads the same file a fifth time: refused, without calling the upstream. The SDK
    # may retry a 429, but the proxy says not to, so it asks exactly once.
    with pytest.raises(openai.RateLimitError) as raised:
        await agent.turn(client(proxy, max_retries=2))
    assert len(sim.requests) == upstream_calls
    error = raised.value
    assert error.status_code == 429
    assert error.response.headers["x-should-retry"] == "false"
    assert error.code == "loop_detected" and error.type == "loop_detected"
    assert isinstance(error.body, dict)
    assert error.body["message"].startswith(
        "loop detected: read_file was called with the same arguments 5 times in the last 5 calls"
    )
    loop = error.body["loop"]
    assert loop["tool"] == "read_file" and loop["repeats"] == 5 and loop["window"] == 5
    assert loop["level"] == 3 and loop["kind"] == "repeat" and len(loop["hash"]) == 16
    assert error.body["request_id"] == error.response.headers["x-request-id"]
    assert blocks_counted(await metrics_text(proxy)) == 1


async def test_sessions_are_judged_apart(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(responder=stubborn_model)
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()))
    first = Agent(proxy, False, {"x-agentproxy-session": "first"})
    second = Agent(proxy, False, {"x-agentproxy-session": "second"})
    sdk = client(proxy)
    for _ in range(5):
        await first.turn(sdk)
    for _ in range(4):
        await second.turn(sdk)
    assert "loops.no_tools" in first.applied[-1]
    assert "loops.warn" in second.applied[-1]


async def test_dry_run_reports_the_ladder_but_never_blocks(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(responder=stubborn_model)
    policies = """
    policies:
      - name: watch
        mode: dry_run
        loops: {ladder: [warn, block]}
    """
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), policies)
    agent = Agent(proxy, False, {**SESSION, "x-agentproxy-policy": "watch"})
    sdk = client(proxy)
    for _ in range(8):
        await agent.turn(sdk)
    assert len(sim.requests) == 8  # every turn reached the model
    decided = [re.findall(r"loops\.(\w+)", applied) for applied in agent.applied]
    assert decided == [[], [], [], ["warn"], ["block"], ["block"], ["block"], ["block"]]
    for request in sim.requests:  # and it saw exactly the agent's own history
        assert "tool_choice" not in request.body
        assert not any("[agentproxy]" in str(m.get("content")) for m in request.body["messages"])


async def test_allowed_polling_is_never_a_loop(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(responder=stubborn_model)
    policies = """
    policies:
      - name: polling
        loops: {allow: [read_file]}
    """
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), policies)
    agent = Agent(proxy, False, SESSION)
    sdk = client(proxy)
    for _ in range(8):
        await agent.turn(sdk)
    assert not any("loops." in applied for applied in agent.applied)


EXEC = {"type": "custom", "custom": {"name": "exec", "format": {"type": "text"}}}
SCRIPT = "const r = await tools.shell({cmd: 'cat missing.txt'});\ntext(r);"


async def test_custom_tool_calls_in_chat_are_free_text_and_their_repeats_are_loops(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """Chat Completions' custom tool calls (`type: "custom"`, free-text `custom.input`): the
    same script three times is a loop, and its text is never flagged as bad JSON (a function
    call's broken arguments still are)."""
    sim = Simulator()
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()))
    bad = {"id": "bad", "type": "function", "function": {"name": "read_file", "arguments": "{pa"}}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Summarize notes."},
        {"role": "assistant", "content": None, "tool_calls": [bad]},
        {"role": "tool", "tool_call_id": "bad", "content": "error"},
    ]
    for turn in range(3):
        call = {"id": f"x{turn}", "type": "custom", "custom": {"name": "exec", "input": SCRIPT}}
        history += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"x{turn}", "content": "ENOENT"},
        ]
    raw = await client(proxy).chat.completions.with_raw_response.create(
        model="sim",
        messages=history,  # type: ignore[arg-type]
        tools=[*TOOLS, EXEC],  # type: ignore[list-item]
        extra_headers=SESSION,
    )
    applied = raw.headers["x-agentproxy-applied"]
    assert "repair.flagged_bad_arguments;count=1" in applied
    assert "loops.warn" in applied
    sent = sim.requests[-1].body["messages"]
    assert sent[3:-1] == history[3:]  # the custom calls and their results as sent
    assert sent[-1]["content"].startswith(
        "[agentproxy] You have called exec with the same arguments 3 times in your last 4 calls"
    )
