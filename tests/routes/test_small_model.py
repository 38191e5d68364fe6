"""A long session with a small model as its own summarizer, through the real proxy over real
sockets, driven by the openai SDK (issue 15): every summary it writes has no sections and
declares the goal achieved. The proxy rejects them (middle-out instead) and keeps the goal
beside each compaction, so the goal reaches the model in every request, and what was cut is
still found by the model's recall.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import openai
import orjson
from aiohttp.test_utils import TestServer

from proxy.sim.model import is_summary_request
from proxy.sim.simulator import Simulator
from tests.conftest import SimProxyFactory, base_url
from tests.support.sim_responders import ForgetfulSummarizer

WINDOW = 32_768
TURNS = 40
GOAL = "GOAL: find why the nightly build fails and fix its cause in ci/nightly.sh"
NEEDLE = "The launch code is PINEAPPLE-7731."
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "read_log",
            "parameters": {"type": "object", "properties": {"part": {"type": "integer"}}},
        },
    }
]


def log_part(part: int) -> str:
    """~2,500 tokens of build log; part 2 holds the needle."""
    lines = [f"[part {part}] step {i}: compiling module_{i}.c ... ok" for i in range(200)]
    if part == 2:
        lines[120] = NEEDLE
    return "\n".join(lines)


def agent(chat: dict[str, Any]) -> dict[str, Any]:
    """The model in the session: reads the log part after part; asked for the launch code,
    it searches what the proxy archived, then answers from what came back."""
    messages = chat["messages"]
    last = messages[-1]
    if last.get("tool_call_id") == "call_recall" and NEEDLE in str(last["content"]):
        return {"role": "assistant", "content": f"Found it: {NEEDLE}"}
    if last["role"] == "user" and "launch code" in str(last["content"]):
        arguments = '{"query": "launch code"}'
        function = {"name": "agentproxy_recall", "arguments": arguments}
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_recall", "type": "function", "function": function}],
        }
    part = next_part(messages)
    function = {"name": "read_log", "arguments": f'{{"part": {part}}}'}
    call = {"id": f"call_{part}", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def next_part(messages: list[dict[str, Any]]) -> int:
    """The part after the last one read: the latest call stays in the verbatim recent part
    of a compacted history, so a compaction does not restart the reading."""
    for message in reversed(messages):
        for call in message.get("tool_calls") or ():
            if call["function"]["name"] == "read_log":
                return int(orjson.loads(call["function"]["arguments"])["part"]) + 1
    return 0


def goal_is_in(body: dict[str, Any]) -> bool:
    return any(m.get("role") == "user" and GOAL in str(m.get("content")) for m in body["messages"])


async def test_the_goal_survives_forty_turns_of_forgetful_summaries(
    proxy_for: SimProxyFactory,
) -> None:
    model = ForgetfulSummarizer(agent)
    sim = Simulator(context_window=WINDOW, responder=model)
    proxy = await proxy_for(sim, window=WINDOW)
    ai = openai.AsyncOpenAI(base_url=base_url(proxy), api_key="unused", max_retries=0)
    headers = {"x-agentproxy-session": "nightly"}
    history: list[Any] = [{"role": "user", "content": f"{GOAL}\nStart with the build log."}]
    applied: list[str] = []
    for _ in range(TURNS):
        raw = await ai.chat.completions.with_raw_response.create(
            model="sim", messages=history, tools=TOOLS, extra_headers=headers
        )
        applied.append(raw.headers.get("x-agentproxy-applied", ""))
        message = raw.parse().choices[0].message
        assert message.tool_calls, "the model keeps working"
        history.append(message.model_dump(exclude_unset=True))
        part = int(re.findall(r"\d+", message.tool_calls[0].function.arguments)[0])
        history.append(
            {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": log_part(part)}
        )
    history.append({"role": "user", "content": "Before you go on: what was the launch code?"})
    reply = await ai.chat.completions.create(
        model="sim", messages=history, tools=TOOLS, extra_headers=headers
    )
    assert reply.choices[0].message.content == f"Found it: {NEEDLE}"

    agent_requests = [r.body for r in sim.requests if not is_summary_request(r.body["messages"])]
    assert len(agent_requests) == TURNS + 2  # the last question took a recall round
    assert all(goal_is_in(body) for body in agent_requests)
    # Compaction happened several times, each summary was rejected, none reached the model.
    events = sum("compaction.middle_out" in a for a in applied)
    assert events >= 3 and model.summaries == events
    assert not any("goal was achieved" in str(b["messages"]) for b in agent_requests)
    # The needle's turn left the context long before the question.
    assert not any(NEEDLE in str(b["messages"]) for b in agent_requests[-5:-1])
    assert await rejected(proxy) == events


async def rejected(proxy: TestServer) -> float:
    async with aiohttp.ClientSession() as http:
        async with http.get(str(proxy.make_url("/metrics"))) as response:
            text = await response.text()
    line = 'agentproxy_rewrites_total{action="summary_rejected",stage="compaction"} '
    found = [row for row in text.splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0
