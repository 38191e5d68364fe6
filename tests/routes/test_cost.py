"""What a session costs, through the real proxy with the real SDKs over real sockets: cached
Anthropic, OpenAI chat and OpenAI Responses sessions (reasoning included) are billed exactly
what a hand computation from the price map gives — cached reads and cache writes at their own
rates, reasoning as output, a per-model override in the YAML winning — and budgets charge the
same."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from proxy.state import CATALOG
from tests.conftest import ProxyFactory
from tests.support.scrape import metrics_of, sample

UPSTREAM_KEY = "sk-sim-upstream-secret"
# By hand, from litellm's price map (the test checks that these are its entries):
# (input, cached read, cache write, output) in USD per token.
PRICES = {
    "claude-sonnet-4-5-20250929": (3e-6, 0.3e-6, 3.75e-6, 15e-6),
    "gpt-4o": (2.5e-6, 1.25e-6, None, 10e-6),
    "o3-mini": (1.1e-6, 0.55e-6, None, 4.4e-6),
}
OVERRIDE = (1e-6, 0.1e-6, None, 2e-6)  # the YAML's own prices for `gpt-own`
BUDGET_USD = 10.0
SYSTEM = "You are a careful coding agent working in a large repository. " * 40  # ~600 tokens
TASK = "Read the parser and explain how it handles nested quotes, step by step. " * 12


def config(url: str, state: Path) -> str:
    return textwrap.dedent(
        f"""\
        store: {{path: {state}}}
        model_list:
          - model_name: claude
            litellm_params: {{model: anthropic/claude-sonnet-4-5-20250929, api_base: "{url}",
                              api_key: {UPSTREAM_KEY}}}
          - model_name: gpt
            litellm_params: {{model: openai/gpt-4o, api_base: "{url}/v1", api_key: {UPSTREAM_KEY}}}
          - model_name: reasoner
            litellm_params: {{model: openai/o3-mini, api_base: "{url}/v1", api_key: {UPSTREAM_KEY}}}
          - model_name: gpt-own
            litellm_params: {{model: openai/gpt-4o, api_base: "{url}/v1", api_key: {UPSTREAM_KEY}}}
            model_info: {{input_cost_per_token: {OVERRIDE[0]}, cache_read_input_token_cost:
                          {OVERRIDE[1]}, output_cost_per_token: {OVERRIDE[3]}}}
        policies:
          - name: metered
            budgets: [{{name: spend, scope: global, limits: {{cost_usd: {BUDGET_USD}}}}}]
        """
    )


def price_map() -> dict[str, Any]:
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "model_prices_and_context_window_backup.json"
    prices: dict[str, Any] = json.loads(path.read_text())
    return prices


def test_the_hand_prices_are_the_price_maps() -> None:
    entries = price_map()
    for model, (read_in, cached, written, out) in PRICES.items():
        entry = entries[model]
        assert entry["input_cost_per_token"] == read_in
        assert entry["cache_read_input_token_cost"] == cached
        assert entry.get("cache_creation_input_token_cost") == written
        assert entry["output_cost_per_token"] == out


@pytest.fixture
async def proxy(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> tuple[TestServer, Simulator]:
    sim = Simulator(context_window=200_000, api_key=UPSTREAM_KEY)
    upstream = await aiohttp_server(sim.app())
    path = tmp_path / "cost.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), tmp_path / "state"))
    server = await start_proxy(path)
    await server.app[CATALOG].ready()  # litellm's price map, read in the background
    return server, sim


def by_hand(prices: tuple[float, float, float | None, float], usage: dict[str, int]) -> float:
    read_in, cached, written, out = prices
    return (
        usage["uncached"] * read_in
        + usage["read"] * cached
        + usage["write"] * (written if written is not None else read_in)
        + usage["output"] * out
    )


HEADERS = {"x-agentproxy-policy": "metered"}


async def anthropic_session(proxy: TestServer) -> dict[str, int]:
    """Three turns of a Claude Code-like session: a cached system prompt, the breakpoint
    moving to the newest block every turn."""
    sdk = anthropic.AsyncAnthropic(
        base_url=str(proxy.make_url("")).rstrip("/"), api_key="unused", max_retries=0
    )
    totals = {"uncached": 0, "read": 0, "write": 0, "output": 0}
    messages: list[dict[str, Any]] = []
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    for turn in range(3):
        block = {"type": "text", "text": f"{TASK} (turn {turn})"}
        messages.append(
            {"role": "user", "content": [block | {"cache_control": {"type": "ephemeral"}}]}
        )
        reply = await sdk.messages.create(
            model="claude",
            max_tokens=300,
            system=system,  # type: ignore[arg-type]
            messages=messages,  # type: ignore[arg-type]
            extra_headers=HEADERS | {"x-agentproxy-session": "claude-session"},
        )
        used = reply.usage
        totals["uncached"] += used.input_tokens
        totals["read"] += used.cache_read_input_tokens or 0
        totals["write"] += used.cache_creation_input_tokens or 0
        totals["output"] += used.output_tokens
        messages[-1] = {"role": "user", "content": [block]}  # the breakpoint moves on
        messages.append({"role": "assistant", "content": reply.content[0].text})  # type: ignore[union-attr]
    await sdk.close()
    assert totals["read"] > 0 and totals["write"] > 0  # the cache was used both ways
    return totals


async def chat_session(proxy: TestServer, alias: str) -> dict[str, int]:
    """Three turns over Chat Completions (the last streamed); OpenAI caches prefixes itself."""
    sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="unused", max_retries=0)
    totals = {"uncached": 0, "read": 0, "write": 0, "output": 0}
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(3):
        messages.append({"role": "user", "content": f"{TASK} (turn {turn})"})
        headers = HEADERS | {"x-agentproxy-session": f"{alias}-session"}
        if turn < 2:
            reply = await sdk.chat.completions.create(
                model=alias,
                messages=messages,
                extra_headers=headers,  # type: ignore[arg-type]
            )
            usage, text = reply.usage, reply.choices[0].message.content
        else:
            stream = await sdk.chat.completions.create(
                model=alias,
                messages=messages,  # type: ignore[arg-type]
                extra_headers=headers,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, usage = "", None
            async for chunk in stream:
                text += "".join(c.delta.content or "" for c in chunk.choices)
                usage = chunk.usage or usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens or 0
        totals["uncached"] += usage.prompt_tokens - cached
        totals["read"] += cached
        totals["output"] += usage.completion_tokens
        messages.append({"role": "assistant", "content": text})
    await sdk.close()
    assert totals["read"] > 0
    return totals


async def responses_session(proxy: TestServer) -> tuple[dict[str, int], int]:
    """Two turns of a reasoning model over Responses; its reasoning is billed as output."""
    sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="unused", max_retries=0)
    totals = {"uncached": 0, "read": 0, "write": 0, "output": 0}
    reasoning = 0
    items: list[dict[str, Any]] = [{"role": "developer", "content": SYSTEM}]
    for turn in range(2):
        items.append({"role": "user", "content": f"{TASK} (turn {turn})"})
        reply = await sdk.responses.create(
            model="reasoner",
            input=items,  # type: ignore[arg-type]
            reasoning={"effort": "medium"},
            store=False,
            extra_headers=HEADERS | {"x-agentproxy-session": "reasoner-session"},
        )
        usage = reply.usage
        assert usage is not None
        cached = usage.input_tokens_details.cached_tokens
        totals["uncached"] += usage.input_tokens - cached
        totals["read"] += cached
        totals["output"] += usage.output_tokens  # reasoning tokens are within them
        reasoning += usage.output_tokens_details.reasoning_tokens
        items.append({"role": "assistant", "content": reply.output_text})
    await sdk.close()
    return totals, reasoning


async def test_a_cached_session_costs_what_the_price_map_says(
    proxy: tuple[TestServer, Simulator],
) -> None:
    server, _ = proxy
    claude = await anthropic_session(server)
    gpt = await chat_session(server, "gpt")
    own = await chat_session(server, "gpt-own")
    reasoner, reasoning = await responses_session(server)
    assert reasoning > 0
    expected = {
        "claude": by_hand(PRICES["claude-sonnet-4-5-20250929"], claude),
        "gpt": by_hand(PRICES["gpt-4o"], gpt),
        "gpt-own": by_hand(OVERRIDE, own),
        "reasoner": by_hand(PRICES["o3-mini"], reasoner),
    }
    metrics = await metrics_of(server)
    for alias, cost in expected.items():
        billed = sample(metrics, "agentproxy_cost_usd_total", model=alias)
        assert billed == pytest.approx(cost, rel=1e-9), alias
    # Priced at the full input rate, the cached turns would have cost more: the cache counts.
    full = PRICES["claude-sonnet-4-5-20250929"][0]
    flat = (claude["uncached"] + claude["read"] + claude["write"]) * full
    assert expected["claude"] < flat + claude["output"] * PRICES["claude-sonnet-4-5-20250929"][3]
    # The budget was charged the same amounts.
    used = sample(metrics, "agentproxy_budget_used_ratio", budget="spend", limit="cost_usd")
    assert used * BUDGET_USD == pytest.approx(sum(expected.values()), rel=1e-9)
