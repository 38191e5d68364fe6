"""History rewriting through the real proxy, over real sockets, with thresholds lowered so the
events happen often (as LangChain's targeted evals for deepagents do)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory, SimProxyFactory, base_url, sim_config

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for name in ("read_file", "write_file")
]
NEEDLE = "The launch code is PINEAPPLE-7731."


def call(call_id: str, name: str = "read_file", arguments: str = '{"path": "a.txt"}') -> Any:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


def result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def big_file(lines: int = 400, needle_at: int = 200) -> str:
    rows = [f"line {i}: nothing to see here, just filler text for the test" for i in range(lines)]
    rows[needle_at] = NEEDLE
    return "\n".join(rows)


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, policy: str = ""
) -> TestServer:
    path = tmp_path / "c.yaml"
    extra = f"""
    store:
      path: {tmp_path / "state"}
    policies:
      - name: tight
        offload: {{min_tokens: 500}}
    {policy}
    """
    path.write_text(sim_config(str(upstream.make_url("")).rstrip("/"), extra))
    return await start_proxy(path)


def client(proxy: TestServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused", max_retries=0)


async def test_dangling_tool_call_is_repaired_before_the_provider_sees_it(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, sim: Simulator
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server)
    history = [
        {"role": "user", "content": "read it"},
        call("call_1"),
        {"role": "user", "content": "never mind, just say hi"},
    ]
    raw = await client(proxy).chat.completions.with_raw_response.create(
        model="sim",
        messages=history,
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert raw.parse().choices[0].message.content == "You said: never mind, just say hi"
    assert "repair.patched_dangling;count=1" in raw.headers["x-agentproxy-applied"]
    sent = sim.requests[-1].body["messages"]
    assert sent[2]["role"] == "tool" and "did not complete" in sent[2]["content"]


async def test_large_result_is_offloaded_stored_and_readable_by_people(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, sim: Simulator
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server)
    content = big_file()
    history = [{"role": "user", "content": "read a.txt"}, call("c1"), result("c1", content)]
    raw = await client(proxy).chat.completions.with_raw_response.create(
        model="sim",
        messages=history,
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert "offload.offloaded;count=1" in raw.headers["x-agentproxy-applied"]
    pointer = sim.requests[-1].body["messages"][2]["content"]
    assert pointer.startswith("[agentproxy] This tool result was offloaded")
    ref = re.search(r"reference: (ap_\w+)", pointer).group(1)  # type: ignore[union-attr]
    assert any(t["function"]["name"] == "agentproxy_recall" for t in sim.requests[-1].body["tools"])
    async with aiohttp.ClientSession() as http:
        async with http.get(str(proxy.make_url(f"/v1/agentproxy/archive/{ref}"))) as r:
            assert r.status == 200
            assert (await r.json())["content"] == content
        async with http.get(str(proxy.make_url("/metrics"))) as r:
            metrics = await r.text()
    assert 'agentproxy_rewrites_total{action="offloaded",stage="offload"} 1.0' in metrics
    saved = re.search(r'agentproxy_tokens_saved_total\{stage="offload"\} (\S+)', metrics)
    assert saved and float(saved.group(1)) > 1000
    # The next turn rewrites the same result to the same bytes (prefix-stable).
    await client(proxy).chat.completions.create(
        model="sim",
        messages=[*history, {"role": "user", "content": "thanks"}],  # type: ignore[list-item]
    )
    assert sim.requests[-1].body["messages"][2]["content"] == pointer


def recalling_model(body: dict[str, Any]) -> dict[str, Any]:
    """A scripted model that looks things up: asked about the code, it recalls the offloaded
    file by reference, then answers from what came back."""
    messages = body["messages"]
    last = messages[-1]
    if last["role"] == "tool" and NEEDLE in str(last["content"]):
        return {"role": "assistant", "content": f"Found it: {NEEDLE}"}
    if last["role"] == "user" and "launch code" in str(last["content"]):
        pointer = next(m for m in messages if "reference: ap_" in str(m.get("content")))
        ref = re.search(r"reference: (ap_\w+)", pointer["content"]).group(1)  # type: ignore[union-attr]
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_recall_1",
                    "type": "function",
                    "function": {"name": "agentproxy_recall", "arguments": f'{{"ref": "{ref}"}}'},
                }
            ],
        }
    return {"role": "assistant", "content": "ok"}


@pytest.mark.parametrize("stream", [False, True])
async def test_needle_in_an_offloaded_result_comes_back_through_recall(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, stream: bool
) -> None:
    sim = Simulator(responder=recalling_model)
    upstream = await aiohttp_server(sim.app())
    proxy = await start(start_proxy, tmp_path, upstream)
    history = [
        {"role": "user", "content": "read the notes"},
        call("c1"),
        result("c1", big_file()),
        {"role": "user", "content": "What is the launch code?"},
    ]
    if stream:
        chunks = [
            c
            async for c in await client(proxy).chat.completions.create(
                model="sim",
                messages=history,
                tools=TOOLS,
                stream=True,  # type: ignore[arg-type]
            )
        ]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    else:
        reply = await client(proxy).chat.completions.create(
            model="sim",
            messages=history,
            tools=TOOLS,  # type: ignore[arg-type]
        )
        text = reply.choices[0].message.content or ""
        assert reply.choices[0].message.tool_calls is None
    assert text == f"Found it: {NEEDLE}"
    assert len(sim.requests) == 2  # the recall round happened inside the proxy
    second = sim.requests[1].body["messages"]
    assert second[-1]["role"] == "tool" and NEEDLE in second[-1]["content"]


async def test_dry_run_reports_but_forwards_the_original(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, sim: Simulator
) -> None:
    proxy = await start(
        start_proxy,
        tmp_path,
        sim_server,
        policy="""  - name: watch
        mode: dry_run
        offload: {min_tokens: 500}
    """,
    )
    content = big_file()
    history = [{"role": "user", "content": "read a.txt"}, call("c1"), result("c1", content)]
    raw = await client(proxy).chat.completions.with_raw_response.create(
        model="sim",
        messages=history,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        extra_headers={"x-agentproxy-policy": "watch"},
    )
    assert raw.headers["x-agentproxy-dry-run"] == "true"
    assert "offload.offloaded" in raw.headers["x-agentproxy-applied"]
    assert sim.requests[-1].body["messages"][2]["content"] == content


async def test_offloaded_references_survive_a_restart(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, sim: Simulator
) -> None:
    history = [{"role": "user", "content": "read a.txt"}, call("c1"), result("c1", big_file())]
    first = await start(start_proxy, tmp_path, sim_server)
    await client(first).chat.completions.create(model="sim", messages=history)  # type: ignore[arg-type]
    pointer = sim.requests[-1].body["messages"][2]["content"]
    await first.close()
    second = await start(start_proxy, tmp_path, sim_server)
    await client(second).chat.completions.create(model="sim", messages=history)  # type: ignore[arg-type]
    assert sim.requests[-1].body["messages"][2]["content"] == pointer
    ref = re.search(r"reference: (ap_\w+)", pointer).group(1)  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as http:
        async with http.get(str(second.make_url(f"/v1/agentproxy/archive/{ref}"))) as r:
            assert r.status == 200


def long_task(goal: str, steps: int, result_chars: int = 1200) -> list[dict[str, Any]]:
    """An agent deep in a task: the goal, then many read_file rounds."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": goal},
    ]
    for i in range(steps):
        history.append(call(f"c{i}", arguments=f'{{"path": "src/module_{i}.py"}}'))
        history.append(result(f"c{i}", f"# module {i}\n" + "x = 1\n" * (result_chars // 6)))
    return history


async def test_overflow_is_compacted_and_retried_once(proxy_for: SimProxyFactory) -> None:
    # The provider's real window (3,000) is smaller than the configured one (100,000), so
    # only the provider's own "context exceeded" answer reveals the overflow.
    sim = Simulator(context_window=3000)
    proxy = await proxy_for(sim, window=100_000)
    history = long_task("Port the parser to Rust and keep the tests green.", steps=12)
    raw = await client(proxy).chat.completions.with_raw_response.create(
        model="sim",
        messages=history,
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert raw.http_response.status_code == 200
    assert "compaction.overflow_compacted" in raw.headers["x-agentproxy-applied"]
    sent = [r for r in sim.requests if "summary" not in str(r.body["messages"][0])]
    assert sent[0].body["messages"] == history  # first try: untouched, and rejected
    assert len(sent[-1].body["messages"]) < len(history)  # the retry: compacted, accepted
    first_round = len(sim.requests)

    # The same request again: the proxy remembers the window it learned and fits the
    # history before sending, instead of overflowing and recovering again.
    raw = await client(proxy).chat.completions.with_raw_response.create(
        model="sim",
        messages=history,
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert raw.http_response.status_code == 200
    assert len(sim.requests) - first_round <= 2  # at most a summary and one accepted call
    assert "overflow_compacted" not in raw.headers["x-agentproxy-applied"]


async def test_goal_survives_summarization_mid_task(proxy_for: SimProxyFactory) -> None:
    sim = Simulator(context_window=4000)
    proxy = await proxy_for(sim, window=4000)
    goal = "Migrate the billing service to Postgres 16 without downtime."
    history = long_task(goal, steps=3)
    summarized = False
    for step in range(3, 30):
        history.append(
            {"role": "user", "content": f'Next: read_file({{"path": "src/m{step}.py"}})'}
        )
        raw = await client(proxy).chat.completions.with_raw_response.create(
            model="sim",
            messages=history,
            tools=TOOLS,  # type: ignore[arg-type]
        )
        applied = raw.headers.get("x-agentproxy-applied", "")
        message = raw.parse().choices[0].message
        assert message.tool_calls, "the agent keeps working through compaction"
        sent = sim.requests[-1].body["messages"]
        if "compaction.summarized" in applied or "checkpoint_reused" in applied:
            summarized = True
            summary = next(
                m["content"] for m in sent if "Earlier conversation summarized" in str(m["content"])
            )
            assert f"SESSION INTENT:\n{goal}" in summary
        history.append(message.model_dump(exclude_none=True))
        history.append(result(message.tool_calls[0].id, "def f():\n    return 1\n" * 60))
    assert summarized, "the task was long enough to need a summary"
    async with aiohttp.ClientSession() as http:
        async with http.get(str(proxy.make_url("/metrics"))) as r:
            metrics = await r.text()
    assert 'agentproxy_summarizer_duration_seconds_count{result="ok"}' in metrics
