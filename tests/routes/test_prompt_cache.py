"""The provider's prompt cache keeps hitting through the proxy, and the proxy makes a long
session cheaper, over real sockets against the simulator's honest prompt caches.

An agent reads source files for 50 requests (25 tool rounds: a call, then its ~6 KB result),
once through the proxy — results offloaded, the history compacted into checkpoints as it
nears a small window — and once straight to the model. Through the proxy, the byte-stable
checkpoints keep at least 80% of the prompt tokens read from the cache over the session, and
the bill, every token at its own rate (cached reads, cache writes, the summarizer's calls),
is lower than the same session sent without the proxy.
"""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from proxy.sim.simulator import Simulator
from proxy.state import CATALOG
from tests.conftest import ProxyFactory
from tests.support.scrape import metrics_of, sample

UPSTREAM_KEY = "sk-sim-upstream-secret"
REQUESTS = 50
WINDOW = 6_000  # the proxy's idea of the window: compaction a few times in the session
# USD per token: (input, cached read, cache write, output), as litellm's price map has them
# (tests/routes/test_cost.py checks these); the summarizer is a cheaper model.
PRICES = {
    "claude": (3e-6, 0.3e-6, 3.75e-6, 15e-6),  # claude-sonnet-4-5-20250929
    "gpt": (2.5e-6, 1.25e-6, 2.5e-6, 10e-6),  # gpt-4o (no cache write price: the input's)
}
SUMMARIZER = (1e-6, 5e-6)  # input, output
SYSTEM = (
    "You are a coding agent porting a parser to a new API. Read each file before changing "
    "it, keep the tests green, and explain what you changed. "
) * 30  # ~1.1k tokens, cached
TASK = 'Port the parser module by module. Next: read_file({"path": "src/m0.py"})'


def source_file(step: int) -> str:
    """A ~6 KB file the agent read."""
    lines = [f"# src/m{step}.py: module {step} of the parser"]
    for n in range(150):
        lines.append(f"def rule_{step}_{n}(tokens, at={n}):  return tokens[at:{n + step}]")
    return "\n".join(lines)[:6_000]


def config(url: str, state: Path) -> str:
    return textwrap.dedent(
        f"""\
        store: {{path: {state}}}
        model_list:
          - model_name: claude
            litellm_params: {{model: anthropic/claude-sonnet-4-5-20250929, api_base: "{url}",
                              api_key: {UPSTREAM_KEY}}}
            model_info: {{max_input_tokens: {WINDOW}}}
          - model_name: gpt
            litellm_params: {{model: openai/gpt-4o, api_base: "{url}/v1", api_key: {UPSTREAM_KEY}}}
            model_info: {{max_input_tokens: {WINDOW}}}
          - model_name: summ
            litellm_params: {{model: openai/summ, api_base: "{url}/v1", api_key: {UPSTREAM_KEY}}}
            model_info: {{max_input_tokens: 100000, input_cost_per_token: {SUMMARIZER[0]},
                          output_cost_per_token: {SUMMARIZER[1]}}}
        policies:
          - name: agent
            offload: {{min_tokens: 1000}}
            compaction: {{summarizer_model: summ}}
        """
    )


OPENED: list[anthropic.AsyncAnthropic | openai.AsyncOpenAI] = []


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while OPENED:
        await OPENED.pop().close()


class Bill:
    def __init__(self) -> None:
        self.uncached = self.read = self.written = self.output = 0

    def cost(self, wire: str) -> float:
        read_in, cached, written, out = PRICES[wire]
        return (
            self.uncached * read_in
            + self.read * cached
            + self.written * written
            + self.output * out
        )

    @property
    def hit_ratio(self) -> float:
        return self.read / (self.uncached + self.read + self.written)


class ClaudeCode:
    """Sends its history as Claude Code does: the system prompt and the last tool cached,
    and a breakpoint on the newest block, moving every turn."""

    def __init__(self, base_url: str, key: str) -> None:
        self.sdk = anthropic.AsyncAnthropic(base_url=base_url, api_key=key, max_retries=0)
        OPENED.append(self.sdk)
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
        self.bill = Bill()

    async def request(self, step: int) -> str:
        last = self.messages[-1]
        blocks = (
            last["content"]
            if isinstance(last["content"], list)
            else [{"type": "text", "text": last["content"]}]
        )
        marked = [*blocks[:-1], {**blocks[-1], "cache_control": {"type": "ephemeral"}}]
        tool = {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            "cache_control": {"type": "ephemeral"},
        }
        raw = await self.sdk.messages.with_raw_response.create(
            model="claude",
            max_tokens=1024,
            system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
            tools=[tool],  # type: ignore[list-item]
            messages=[*self.messages[:-1], {**last, "content": marked}],  # type: ignore[arg-type]
            extra_headers={"x-agentproxy-session": "porting", "x-agentproxy-policy": "agent"},
        )
        reply = await raw.parse()
        used = reply.usage
        self.bill.uncached += used.input_tokens
        self.bill.read += used.cache_read_input_tokens or 0
        self.bill.written += used.cache_creation_input_tokens or 0
        self.bill.output += used.output_tokens
        content = [block.model_dump(exclude_none=True) for block in reply.content]
        self.messages.append({"role": "assistant", "content": content})
        calls = [block for block in content if block["type"] == "tool_use"]
        if calls:
            self.messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": c["id"],
                            "content": source_file(step),
                        }
                        for c in calls
                    ],
                }
            )
        else:
            ask = f'Next: read_file({{"path": "src/m{step + 1}.py"}})'
            self.messages.append({"role": "user", "content": ask})
        return raw.headers.get("x-agentproxy-applied", "")


class Codex:
    """The same agent over Chat Completions: OpenAI caches prefixes without breakpoints."""

    def __init__(self, base_url: str, key: str) -> None:
        self.sdk = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
        OPENED.append(self.sdk)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TASK},
        ]
        self.bill = Bill()

    async def request(self, step: int) -> str:
        tool = {
            "type": "function",
            "function": {
                "name": "read_file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
        raw = await self.sdk.chat.completions.with_raw_response.create(
            model="gpt",
            messages=self.messages,  # type: ignore[arg-type]
            tools=[tool],  # type: ignore[list-item]
            extra_headers={"x-agentproxy-session": "porting", "x-agentproxy-policy": "agent"},
        )
        reply = raw.parse()
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        cached = reply.usage.prompt_tokens_details.cached_tokens or 0
        self.bill.uncached += reply.usage.prompt_tokens - cached
        self.bill.read += cached
        self.bill.output += reply.usage.completion_tokens
        message = reply.choices[0].message.model_dump(exclude_none=True)
        self.messages.append(message)
        for call in message.get("tool_calls") or []:
            self.messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": source_file(step)}
            )
        if not message.get("tool_calls"):
            ask = f'Next: read_file({{"path": "src/m{step + 1}.py"}})'
            self.messages.append({"role": "user", "content": ask})
        return raw.headers.get("x-agentproxy-applied", "")


AGENTS = {"claude": ClaudeCode, "gpt": Codex}


@pytest.mark.parametrize("wire", sorted(AGENTS))
async def test_checkpoints_keep_the_cache_hitting_and_the_bill_lower(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, wire: str
) -> None:
    through = Simulator(context_window=200_000, api_key=UPSTREAM_KEY)
    upstream = await aiohttp_server(through.app())
    path = tmp_path / "cache.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), tmp_path / "state"))
    proxy = await start_proxy(path)
    await proxy.app[CATALOG].ready()
    agent = AGENTS[wire](str(proxy.make_url("")).rstrip("/"), "unused")
    applied = [await agent.request(step // 2) for step in range(REQUESTS)]

    direct_sim = Simulator(context_window=200_000, api_key=UPSTREAM_KEY)
    direct_server = await aiohttp_server(direct_sim.app())
    direct = AGENTS[wire](str(direct_server.make_url("")).rstrip("/"), UPSTREAM_KEY)
    for step in range(REQUESTS):
        await direct.request(step // 2)

    summaries = sum("compaction.summarized" in a for a in applied)
    reused = sum("checkpoint_reused" in a for a in applied)
    assert summaries >= 2 and reused >= 10, applied  # checkpoints at work, not one summary
    assert any("offload.offloaded" in a for a in applied)
    metrics = await metrics_of(proxy)
    kinds = {
        kind: sample(metrics, "agentproxy_prompt_tokens_total", model=wire, kind=kind)
        for kind in ("cache_read", "cache_write", "uncached")
    }
    ratio = kinds["cache_read"] / sum(kinds.values())
    assert ratio == pytest.approx(agent.bill.hit_ratio)  # the metrics say what the client saw
    proxied = sample(metrics, "agentproxy_cost_usd_total", model=wire)
    summarizer = sample(metrics, "agentproxy_cost_usd_total", model="summ")
    assert proxied == pytest.approx(agent.bill.cost(wire))
    assert summarizer == sample(metrics, "agentproxy_summarizer_cost_usd_total", model="summ") > 0
    report = (
        f"hit ratio {ratio:.1%} (direct {direct.bill.hit_ratio:.1%}); bill ${proxied:.4f} "
        f"+ summaries ${summarizer:.4f} vs ${direct.bill.cost(wire):.4f} direct"
    )
    assert ratio >= 0.8, report
    assert proxied + summarizer < direct.bill.cost(wire), report
