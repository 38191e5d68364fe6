"""The summarizer's own calls, through the real proxy over real sockets: they go through
control like the request's (retries, deployment circuits, no compaction of their own) and what
they use is charged to the request, under the summarizer's model.

The proxy and the simulated model both have a 4,000-token window, and one request carries a
history well over it: the proxy summarizes its older part with `summ`, a second alias served
by the same simulator (faults aimed at `summ` leave the request's own calls alone).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Fault, Simulator
from tests.conftest import ProxyFactory
from tests.support.scrape import metrics_of, sample

WINDOW = 4_000
GOAL = "Port the parser to Rust and keep the tests green."
OVERFLOW = {"error": {"message": "x", "type": "invalid_request_error",
                      "code": "context_length_exceeded"}}  # fmt: skip


def config(sim_url: str, policy: str) -> str:
    models = "".join(
        f"""
          - model_name: {alias}
            litellm_params: {{model: openai/{alias}, api_base: "{sim_url}/v1"}}
            model_info: {{max_input_tokens: {WINDOW}, input_cost_per_token: {price},
                          output_cost_per_token: {price}}}"""
        for alias, price in (("sim", 0.0), ("summ", 0.001))
    )
    return (
        textwrap.dedent(f"model_list:{models}\n")
        + textwrap.dedent(
            """
        policies:
          - name: p
            compaction: {summarizer_model: summ}
            retry: {base_s: 0.01, cap_s: 0.02}
        """
        )
        + textwrap.indent(textwrap.dedent(policy), "    ")
    )


async def start(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator, policy: str = ""
) -> TestServer:
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(
        config(str(upstream.make_url("")).rstrip("/"), policy) + f"store: {{path: {tmp_path}}}\n"
    )
    return await start_proxy(path)


def long_task(steps: int = 12) -> list[dict[str, Any]]:
    """An agent deep in a task, ~4,500 tokens: over the trigger at once, nothing offloaded."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": GOAL},
    ]
    for i in range(steps):
        function = {"name": "read_file", "arguments": f'{{"path": "src/m{i}.py"}}'}
        call = {"id": f"c{i}", "type": "function", "function": function}
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        content = f"# module {i}\n" + "x = 1\n" * 230
        history.append({"role": "tool", "tool_call_id": f"c{i}", "content": content})
    history.append({"role": "user", "content": "Go on with the next module."})
    return history


async def ask(
    proxy: TestServer, messages: list[dict[str, Any]], model: str = "sim"
) -> tuple[int, str]:
    body = {"model": model, "messages": messages}
    headers = {"x-agentproxy-session": "task"}
    async with aiohttp.ClientSession() as http:
        url = proxy.make_url("/v1/chat/completions")
        async with http.post(url, json=body, headers=headers) as response:
            await response.read()
            return response.status, response.headers.get("x-agentproxy-applied", "")


def summary_calls(sim: Simulator) -> int:
    return sum(r.body.get("model") == "summ" for r in sim.requests)


async def test_a_summary_call_that_meets_a_503_is_retried(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=WINDOW)
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim)
    sim.inject(Fault(status=503, model="summ"))
    status, applied = await ask(proxy, long_task())
    assert status == 200
    assert summary_calls(sim) == 2  # the 503, then the retry that answered
    assert "compaction.summarized" in applied and "middle_out" not in applied
    assert "retry.retried;count=1" in applied  # what control did for the summary shows too
    metrics = await metrics_of(proxy)
    assert sample(metrics, "agentproxy_retries_total", model="summ", error_class="transient") == 1


async def test_summary_tokens_are_counted_under_its_model_and_charged_to_budgets(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=WINDOW)
    budgets = """\
        budgets: [{name: b, limits: {tokens: 1000000, cost_usd: 1000}}]
    """
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, budgets)
    status, applied = await ask(proxy, long_task())
    assert status == 200 and "compaction.summarized" in applied and summary_calls(sim) == 1
    metrics = await metrics_of(proxy)
    tokens = {
        (model, kind): sample(metrics, "agentproxy_tokens_total", model=model, kind=kind)
        for model in ("sim", "summ")
        for kind in ("prompt", "completion")
    }
    assert tokens[("summ", "prompt")] > 1_000 and tokens[("summ", "completion")] > 0
    assert tokens[("sim", "prompt")] > 0
    summary_cost = 0.001 * (tokens[("summ", "prompt")] + tokens[("summ", "completion")])
    assert abs(sample(metrics, "agentproxy_cost_usd_total", model="summ") - summary_cost) < 1e-9
    # Summaries are their own series too (part of the total): the summarizer's share of spend.
    summarizer = sample(metrics, "agentproxy_summarizer_cost_usd_total", model="summ")
    assert abs(summarizer - summary_cost) < 1e-9
    assert sample(metrics, "agentproxy_summarizer_cost_usd_total", model="sim") == 0
    # The budget was charged the request's own tokens and the summary's, and its cost.
    used = sample(metrics, "agentproxy_budget_used_ratio", budget="b", limit="tokens")
    assert round(used * 1_000_000) == sum(tokens.values())
    spent = sample(metrics, "agentproxy_budget_used_ratio", budget="b", limit="cost_usd")
    assert abs(spent * 1000 - summary_cost) < 1e-9


async def test_the_summarizer_respects_the_deployment_circuit(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=WINDOW)
    circuit = """\
        circuit: {failures: 2, cooldown_s: 600}
    """
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, circuit)
    # Clients calling `summ` directly meet 503s until its deployment's circuit opens.
    sim.inject(Fault(status=503, model="summ", times=6))
    hello = [{"role": "user", "content": "hello"}]
    status, _ = await ask(proxy, hello, model="summ")
    assert status == 503
    before = summary_calls(sim)
    assert before >= 2
    status, _ = await ask(proxy, hello, model="summ")
    assert status == 503 and summary_calls(sim) == before  # open: refused without a call
    sim.faults.clear()  # `summ` would answer now, but its circuit is still cooling down

    status, applied = await ask(proxy, long_task())
    assert status == 200
    assert summary_calls(sim) == before  # the summarizer did not call past the open circuit
    assert "compaction.summarizer_failed" in applied and "compaction.middle_out" in applied


async def test_a_summary_request_is_never_compacted_nor_offered_recall(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=WINDOW)
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim)
    sim.inject(Fault(status=400, body=OVERFLOW, model="summ", times=2))
    status, applied = await ask(proxy, long_task())
    assert status == 200 and "compaction.middle_out" in applied
    summaries = [r.body for r in sim.requests if r.body.get("model") == "summ"]
    # An overflowing summary request is sent again once with half its transcript, never
    # compacted (nor offered recall) like a client's request.
    assert len(summaries) == 2
    first, second = (len(b["messages"][1]["content"]) for b in summaries)
    assert second < 0.6 * first
    assert not any("tools" in b for b in summaries)
    assert "overflow_compacted" not in applied
