"""The summarizer speaks the deployment's own wire format, over real sockets: a Responses
client on a server that serves only /v1/responses (Codex-style), an Anthropic client on one
that serves only /v1/messages, and a chat client whose summarizer model turns out to serve only
/v1/responses (learnt from its 404, once) all get real summaries, charged to the request.

Each upstream is the simulator behind a server that answers 404 `{"detail":"Not Found"}` on
every other route (tests/support/sim_routes.py). Two aliases on it: the agent's `sim` (free)
and the summarizer's `summ` (priced), so the summary's spend shows on its own.
"""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.pipeline.compaction.summarizer import SYSTEM_PROMPT
from proxy.sim.simulator import Fault, Simulator
from tests.conftest import ProxyFactory
from tests.support.scrape import metrics_of, sample
from tests.support.sim_routes import REFUSED, serving_only

WINDOW = 4_000
PRICE = 0.001
GOAL = "Port the parser to Rust and keep the tests green."
SESSION = {"x-agentproxy-session": "task"}
OPENED: list[Any] = []


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while OPENED:
        await OPENED.pop().close()


def models(provider: str, url: str, aliases: tuple[str, ...] = ("sim", "summ")) -> str:
    return "".join(
        f"""
          - model_name: {alias}
            litellm_params: {{model: {provider}/{alias}, api_base: "{url}/v1", api_key: k}}
            model_info: {{max_input_tokens: {WINDOW}, input_cost_per_token: {price},
                          output_cost_per_token: {price}}}"""
        for alias, price in ((a, PRICE if a == "summ" else 0.0) for a in aliases)
    )


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, model_list: str, policy: str = ""
) -> TestServer:
    path = tmp_path / "agentproxy.yaml"
    path.write_text(
        textwrap.dedent(f"model_list:{model_list}\n")
        + textwrap.dedent(
            """
            policies:
              - name: p
                compaction: {summarizer_model: summ}
                retry: {base_s: 0.01, cap_s: 0.02}
            """
        )
        + textwrap.indent(textwrap.dedent(policy), "    ")
        + f"store: {{path: {tmp_path}}}\n"
    )
    return await start_proxy(path)


async def upstream(aiohttp_server: Any, sim: Simulator, *paths: str) -> tuple[TestServer, str]:
    server: TestServer = await aiohttp_server(serving_only(sim, *paths))
    return server, str(server.make_url("")).rstrip("/")


def module(i: int) -> str:
    return f"# module {i}\n" + "x = 1\n" * 230


def is_summary(body: dict[str, Any]) -> bool:
    return body.get("model") == "summ"


async def assert_summary_charged(proxy: TestServer) -> None:
    """The summary's tokens count under `summ`, its cost in the summarizer's series and the
    request's budget."""
    metrics = await metrics_of(proxy)
    prompt = sample(metrics, "agentproxy_tokens_total", model="summ", kind="prompt")
    completion = sample(metrics, "agentproxy_tokens_total", model="summ", kind="completion")
    assert prompt > 1_000 and completion > 0
    cost = PRICE * (prompt + completion)
    assert abs(sample(metrics, "agentproxy_summarizer_cost_usd_total", model="summ") - cost) < 1e-9
    spent = sample(metrics, "agentproxy_budget_used_ratio", budget="b", limit="cost_usd")
    assert abs(spent * 1000 - cost) < 1e-9


BUDGET = """\
    budgets: [{name: b, limits: {tokens: 1000000, cost_usd: 1000}}]
"""


def responses_task(steps: int = 12) -> list[dict[str, Any]]:
    """A Codex-style session deep in a task, ~4,500 tokens: over the trigger at once."""
    items: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    for i in range(steps):
        arguments = f'{{"path": "src/m{i}.py"}}'
        items.append(
            {"type": "function_call", "call_id": f"c{i}", "name": "read_file",
             "arguments": arguments}
        )  # fmt: skip
        items.append({"type": "function_call_output", "call_id": f"c{i}", "output": module(i)})
    items.append({"role": "user", "content": "Go on with the next module."})
    return items


async def test_a_responses_client_on_a_responses_only_server_gets_a_real_summary(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=WINDOW)
    server, url = await upstream(aiohttp_server, sim, "/v1/responses")
    proxy = await start(start_proxy, tmp_path, models("openai", url), BUDGET)
    sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="x", max_retries=0)
    OPENED.append(sdk)
    raw = await sdk.responses.with_raw_response.create(
        model="sim",
        input=responses_task(),
        extra_headers=SESSION,  # type: ignore[arg-type]
    )
    raw.parse()
    applied = raw.headers["x-agentproxy-applied"]
    assert "compaction.summarized" in applied and "summarizer_failed" not in applied
    assert server.app[REFUSED] == []  # never a chat completion
    summaries = [r for r in sim.requests if is_summary(r.body)]
    assert [r.path for r in summaries] == ["/v1/responses"]
    sent = summaries[0].body
    assert sent["instructions"] == SYSTEM_PROMPT and "max_output_tokens" in sent
    # The summary the upstream wrote is what the agent's request carries next.
    agent = [r for r in sim.requests if not is_summary(r.body)][-1]
    assert "earlier messages:" in str(agent.body["input"]) and GOAL in str(agent.body["input"])
    await assert_summary_charged(proxy)


def anthropic_task(steps: int = 12) -> list[dict[str, Any]]:
    """Claude Code deep in a task, ~4,500 tokens."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    for i in range(steps):
        call = {"type": "tool_use", "id": f"c{i}", "name": "read_file",
                "input": {"path": f"src/m{i}.py"}}  # fmt: skip
        messages.append({"role": "assistant", "content": [call]})
        result = {"type": "tool_result", "tool_use_id": f"c{i}", "content": module(i)}
        messages.append({"role": "user", "content": [result]})
    messages.append({"role": "user", "content": "Go on with the next module."})
    return messages


async def test_an_anthropic_client_on_a_messages_only_server_gets_a_native_summary(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=WINDOW)
    server, url = await upstream(aiohttp_server, sim, "/v1/messages")
    proxy = await start(start_proxy, tmp_path, models("anthropic", url), BUDGET)
    sdk = anthropic.AsyncAnthropic(
        base_url=str(proxy.make_url("")).rstrip("/"), api_key="x", max_retries=0
    )
    OPENED.append(sdk)
    raw = await sdk.messages.with_raw_response.create(
        model="sim",
        max_tokens=256,
        messages=anthropic_task(),
        extra_headers=SESSION,  # type: ignore[arg-type]
    )
    raw.parse()
    applied = raw.headers["x-agentproxy-applied"]
    assert "compaction.summarized" in applied and "summarizer_failed" not in applied
    assert server.app[REFUSED] == []
    summaries = [r for r in sim.requests if is_summary(r.body)]
    assert [r.path for r in summaries] == ["/v1/messages"]
    # Anthropic's own shape, as the proxy built it (litellm would send its system as blocks).
    sent = summaries[0]
    assert sent.body["system"] == SYSTEM_PROMPT and isinstance(sent.body["max_tokens"], int)
    assert sent.headers.get("anthropic-version") == "2023-06-01"
    assert set(sent.body) == {"model", "system", "messages", "max_tokens", "stream"}
    agent = [r for r in sim.requests if not is_summary(r.body)][-1]
    assert "earlier messages:" in str(agent.body["messages"])
    await assert_summary_charged(proxy)


def chat_task(steps: int = 12) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    for i in range(steps):
        function = {"name": "read_file", "arguments": f'{{"path": "src/m{i}.py"}}'}
        call = {"id": f"c{i}", "type": "function", "function": function}
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": f"c{i}", "content": module(i)})
    history.append({"role": "user", "content": "Go on with the next module."})
    return history


async def ask_chat(
    proxy: TestServer, messages: list[dict[str, Any]], session: str = "task"
) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        url = proxy.make_url("/v1/chat/completions")
        body = {"model": "sim", "messages": messages}
        headers = {"x-agentproxy-session": session}
        async with http.post(url, json=body, headers=headers) as response:
            await response.read()
            return response.status, response.headers.get("x-agentproxy-applied", "")


async def test_a_chat_summarizer_on_a_responses_only_server_is_learnt_and_sent_responses(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    agent_sim, summ_sim = Simulator(context_window=WINDOW), Simulator(context_window=WINDOW)
    _, agent_url = await upstream(aiohttp_server, agent_sim, "/v1/chat/completions")
    summ_server, summ_url = await upstream(aiohttp_server, summ_sim, "/v1/responses")
    model_list = models("openai", agent_url, ("sim",)) + models("openai", summ_url, ("summ",))
    proxy = await start(start_proxy, tmp_path, model_list, BUDGET)
    status, applied = await ask_chat(proxy, chat_task())
    assert status == 200
    assert "compaction.summarized" in applied and "summarizer_failed" not in applied
    # One chat completion refused with the route's 404, then Responses.
    assert summ_server.app[REFUSED] == ["/v1/chat/completions"]
    assert [r.path for r in summ_sim.requests] == ["/v1/responses"]
    assert "earlier messages:" in str(agent_sim.requests[-1].body["messages"])
    await assert_summary_charged(proxy)
    # Learnt: the next session's summary goes as Responses at once.
    status, applied = await ask_chat(proxy, chat_task(), session="another")
    assert status == 200 and "compaction.summarized" in applied
    assert summ_server.app[REFUSED] == ["/v1/chat/completions"]
    assert [r.path for r in summ_sim.requests] == ["/v1/responses"] * 2


OVERFLOWS = {
    "responses": {"error": {"message": "Your input exceeds the context window of this model. "
                            "Please adjust your input and try again.",
                            "type": "invalid_request_error", "param": "input",
                            "code": "context_length_exceeded"}},
    "anthropic": {"type": "error", "error": {"type": "invalid_request_error",
                                             "message": "prompt is too long: 5000 tokens > "
                                             "4000 maximum"}},
}  # fmt: skip


async def test_an_overflowing_responses_summary_is_sent_again_with_half(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=WINDOW)
    _, url = await upstream(aiohttp_server, sim, "/v1/responses")
    proxy = await start(start_proxy, tmp_path, models("openai", url))
    sim.inject(Fault(status=400, body=OVERFLOWS["responses"], model="summ"))
    sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="x", max_retries=0)
    OPENED.append(sdk)
    raw = await sdk.responses.with_raw_response.create(
        model="sim",
        input=responses_task(),
        extra_headers=SESSION,  # type: ignore[arg-type]
    )
    raw.parse()
    assert "compaction.summarized" in raw.headers["x-agentproxy-applied"]
    first, second = (len(str(r.body["input"])) for r in sim.requests if is_summary(r.body))
    assert second < 0.6 * first


async def test_an_overflowing_anthropic_summary_is_sent_again_with_half(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=WINDOW)
    _, url = await upstream(aiohttp_server, sim, "/v1/messages")
    proxy = await start(start_proxy, tmp_path, models("anthropic", url))
    sim.inject(Fault(status=400, body=OVERFLOWS["anthropic"], model="summ"))
    sdk = anthropic.AsyncAnthropic(
        base_url=str(proxy.make_url("")).rstrip("/"), api_key="x", max_retries=0
    )
    OPENED.append(sdk)
    raw = await sdk.messages.with_raw_response.create(
        model="sim",
        max_tokens=256,
        messages=anthropic_task(),
        extra_headers=SESSION,  # type: ignore[arg-type]
    )
    raw.parse()
    assert "compaction.summarized" in raw.headers["x-agentproxy-applied"]
    first, second = (len(str(r.body["messages"])) for r in sim.requests if is_summary(r.body))
    assert second < 0.6 * first


async def test_a_chat_client_s_summary_goes_to_an_anthropic_model_natively(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    agent_sim, summ_sim = Simulator(context_window=WINDOW), Simulator(context_window=WINDOW)
    _, agent_url = await upstream(aiohttp_server, agent_sim, "/v1/chat/completions")
    summ_server, summ_url = await upstream(aiohttp_server, summ_sim, "/v1/messages")
    model_list = models("openai", agent_url, ("sim",)) + models("anthropic", summ_url, ("summ",))
    proxy = await start(start_proxy, tmp_path, model_list, BUDGET)
    status, applied = await ask_chat(proxy, chat_task())
    assert status == 200
    assert "compaction.summarized" in applied and "summarizer_failed" not in applied
    assert summ_server.app[REFUSED] == []
    (summary,) = summ_sim.requests
    assert summary.path == "/v1/messages" and summary.body["system"] == SYSTEM_PROMPT
    assert set(summary.body) == {"model", "system", "messages", "max_tokens", "stream"}
    await assert_summary_charged(proxy)


async def test_a_summary_that_falls_back_to_a_deployment_of_another_wire_goes_as_chat(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=WINDOW)
    _, url = await upstream(aiohttp_server, sim, "/v1/responses")
    backup = Simulator(context_window=WINDOW)
    _, backup_url = await upstream(aiohttp_server, backup, "/v1/chat/completions")
    model_list = models("openai", url) + models("hosted_vllm", backup_url, ("summ2",))
    fallback = """\
        fallbacks: [{from: summ, to: [summ2]}]
    """
    proxy = await start(start_proxy, tmp_path, model_list, fallback)
    sim.inject(Fault(status=503, model="summ", times=100))
    sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="x", max_retries=0)
    OPENED.append(sdk)
    raw = await sdk.responses.with_raw_response.create(
        model="sim",
        input=responses_task(),
        extra_headers=SESSION,  # type: ignore[arg-type]
    )
    raw.parse()
    applied = raw.headers["x-agentproxy-applied"]
    assert "compaction.summarized" in applied and "fallback.fell_back" in applied
    # The Responses summary met a 503; its fallback, a chat-only server, got it as chat.
    assert {r.path for r in sim.requests if is_summary(r.body)} == {"/v1/responses"}
    (translated,) = backup.requests
    assert translated.path == "/v1/chat/completions"
    assert translated.body["messages"][0]["content"] == SYSTEM_PROMPT
