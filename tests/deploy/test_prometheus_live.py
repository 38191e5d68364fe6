"""Every dashboard query, evaluated by a real Prometheus that scraped a real proxy.

A proxy on a loopback port (in this process) serves a scripted scenario that exercises every
feature a dashboard shows: offload, compaction with a summarizer and a reused checkpoint,
recall, the loop ladder up to a block, a budget refusal, a rate limit, retries on 429 and 503,
a fallback, a circuit opening and a session circuit, a degraded answer, a successful and a
failed hot reload.
Prometheus (the real binary, `apt-get install prometheus`) scrapes /metrics every second over
HTTP; then each `expr` of each panel, with Grafana's variables filled in, must evaluate without
error to a non-empty result. An empty result means a metric or label the dashboard expects is
not exported (or is misnamed). Beyond that, every panel but those counting what should never
happen must show a value above zero: the scenario's activity reached the panel.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Fault, Simulator
from tests.conftest import ProxyFactory
from tests.deploy.prometheus import Prometheus

DASHBOARDS = Path(__file__).resolve().parents[2] / "grafana" / "dashboards"
ADMIN = {"Authorization": "Bearer admin-secret"}
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
LOG = "\n".join(
    f"2026-11-30 10:{i // 60:02d}:{i % 60:02d} INFO request {i} served in {3 + i % 7} ms"
    if i != 377
    else "2026-11-30 10:06:17 ERROR database pool exhausted (code E-4417)"
    for i in range(600)
)
# Panels of things that should never happen: zero is what they show after the scenario.
ZERO_IS_FINE = {
    "Validator rejections + stage failures",
    "Validator rejections and stage failures",
    "Store errors",
}
# Grafana's own variables, as the test fills them in (a 1 s scrape interval makes 1m plenty).
BUILTINS = {"__rate_interval": "1m", "__interval": "1m", "__range": "5m", "__range_s": "300"}


# --- the upstreams and the configuration ---------------------------------------------------


def stubborn_model(body: dict[str, Any]) -> dict[str, Any]:
    """Reads the same missing file forever, unless the request forbids tools."""
    if body.get("tool_choice") == "none":
        return {"role": "assistant", "content": "I cannot read missing.txt; it does not exist."}
    function = {"name": "read_file", "arguments": '{"path": "missing.txt"}'}
    call = {"id": f"call_{len(body['messages'])}", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def model_entry(alias: str, url: str, window: int) -> str:
    return f"""
  - model_name: {alias}
    litellm_params:
      model: openai/{alias}
      api_base: {url}/v1
    model_info:
      max_input_tokens: {window}
      input_cost_per_token: 0.000001
      output_cost_per_token: 0.000002"""


def config_text(sim_url: str, stuck_url: str, state: Path, description: str) -> str:
    models = "".join(
        model_entry(alias, sim_url, window)
        for alias, window in (
            ("sim", 8192),
            ("backup", 8192),
            ("flaky", 8192),
            ("doomed", 8192),
            ("down", 8192),
            ("small", 4000),
        )
    ) + model_entry("stuck", stuck_url, 8192)
    fast = "retry: {attempts: 3, base_s: 0.01, cap_s: 0.05}"
    return (
        textwrap.dedent(
            f"""\
            keys:
              admin_key: admin-secret
            store:
              path: {state}
            model_list:"""
        )
        + models
        + textwrap.dedent(
            f"""
            policies:
              - name: rewrite
                description: {description}
                offload: {{min_tokens: 500}}
                {fast}
              - name: resilient
                {fast}
                fallbacks: [{{from: flaky, to: [backup]}}]
              - name: breaker
                retry: {{attempts: 1}}
                circuit: {{failures: 2, cooldown_s: 0.5, session_failures: 2}}
              - name: degraded
                degraded: true
                retry: {{attempts: 2, base_s: 0.01, cap_s: 0.05}}
              - name: loops
                loops: {{enabled: true, window: 5, repeats: 3}}
              - name: metered
                budgets:
                  - {{name: per-session, limits: {{calls: 2, tokens: 100000}}, soft: 0.5}}
              - name: limited
                limits: {{session: {{rpm: 1}}}}
            """
        )
    )


# --- a small client ------------------------------------------------------------------------


class Client:
    def __init__(self, proxy: TestServer, http: aiohttp.ClientSession) -> None:
        self.proxy = proxy
        self.http = http

    async def chat(
        self,
        policy: str,
        messages: list[dict[str, Any]],
        model: str = "sim",
        session: str | None = None,
        **body: Any,
    ) -> tuple[int, dict[str, str], Any]:
        headers = {"x-agentproxy-policy": policy}
        if session:
            headers["x-agentproxy-session"] = session
        payload = {"model": model, "messages": messages, **body}
        url = str(self.proxy.make_url("/v1/chat/completions"))
        async with self.http.post(url, json=payload, headers=headers) as response:
            raw = await response.read()
            got = {k.lower(): v for k, v in response.headers.items()}
            if body.get("stream") and response.status == 200:
                return response.status, got, raw.decode()
            return response.status, got, json.loads(raw)

    async def reload(self, headers: dict[str, str] = ADMIN) -> int:
        async with self.http.post(
            str(self.proxy.make_url("/admin/reload")), headers=headers, json={}
        ) as r:
            await r.read()
            return r.status


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


# --- the scenario, played in rounds ---------------------------------------------------------
#
# Prometheus sees a counter's first sample as its starting point, not as an increase, so a rate
# panel shows activity only for a series incremented after Prometheus first scraped it. The
# scenario is therefore played twice, with a scrape between the rounds; every round uses its
# own sessions and contents.


async def reloads(client: Client, path: Path, good: str, n: int) -> None:
    await asyncio.to_thread(path.write_text, good.replace("model: openai/sim", "model: 42"))
    assert await client.reload() == 422  # rejected whole; the old config keeps serving
    await asyncio.to_thread(
        path.write_text, good.replace("description: round 0", f"description: round {n}")
    )
    assert await client.reload() == 200
    # A caller with a wrong admin key, refused (and audited) a few times.
    for _ in range(3):
        assert await client.reload({"Authorization": "Bearer not-the-admin-key"}) == 401


async def rewriting(client: Client, n: int) -> None:
    # A 600-line log is offloaded; the model reads part of it back through recall.
    history = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": 'Check the log: read_file({"path": "server.log"})'},
        call("c1", arguments='{"path": "server.log"}'),
        result("c1", f"round {n}\n{LOG}"),
        {
            "role": "user",
            "content": 'Which error was logged? agentproxy_recall({"query": "ERROR"})',
        },
    ]
    status, headers, body = await client.chat("rewrite", history, session=f"log-{n}", tools=TOOLS)
    assert status == 200, body
    assert "offload.offloaded" in headers["x-agentproxy-applied"]
    assert "E-4417" in body["choices"][0]["message"]["content"]  # answered after recall
    status, _, _ = await client.chat("rewrite", [{"role": "user", "content": "hi"}], stream=True)
    assert status == 200

    # A long task on a 4,000-token window: summarized, then the checkpoint is reused.
    history = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": f"Migrate billing service {n} to Postgres 16."},
    ]
    for i in range(3):
        history += [
            call(f"c{i}", arguments=f'{{"path": "src/module_{i}.py"}}'),
            result(f"c{i}", f"# module {i}\n" + "x = 1\n" * 200),
        ]
    seen: set[str] = set()
    for step in range(3, 40):
        history.append(
            {"role": "user", "content": f'Next: read_file({{"path": "src/m{step}.py"}})'}
        )
        status, headers, body = await client.chat(
            "rewrite", history, model="small", session=f"long-task-{n}", tools=TOOLS
        )
        assert status == 200, body
        applied = headers.get("x-agentproxy-applied", "")
        seen |= {a for a in ("compaction.summarized", "checkpoint_reused") if a in applied}
        if len(seen) == 2:
            break
        message = body["choices"][0]["message"]
        history.append({k: v for k, v in message.items() if v is not None})
        history.append(result(message["tool_calls"][0]["id"], "def f():\n    return 1\n" * 60))
    assert seen == {"compaction.summarized", "checkpoint_reused"}, seen


async def resilience(client: Client, sim: Simulator, n: int) -> None:
    hi = [{"role": "user", "content": f"hi {n}"}]
    sim.inject(Fault(status=429, model="sim"), Fault(status=503, model="sim"))
    status, headers, _ = await client.chat("resilient", hi)
    assert status == 200 and "retry.retried;count=2" in headers["x-agentproxy-applied"]

    sim.inject(Fault(status=503, times=3, model="flaky"))
    status, headers, _ = await client.chat("resilient", hi, model="flaky")
    assert status == 200 and headers["x-agentproxy-model"] == "backup"

    # doomed always fails: two failures open its circuit (in later rounds the cooldown has
    # passed, so a probe fails and opens it again); the session that keeps failing the same
    # request is refused, and another request finds the circuit open.
    sim.inject(Fault(status=503, times=5, model="doomed"))
    statuses = [
        (await client.chat("breaker", hi, model="doomed", session=f"breaker-{n}"))[0]
        for _ in range(3)
    ]
    assert statuses[-1] == 429, statuses  # session_circuit_open
    other = [{"role": "user", "content": "other"}]
    status, _, body = await client.chat("breaker", other, model="doomed", session=f"other-{n}")
    assert status == 503 and body["error"]["code"] == "circuit_open", body

    sim.inject(Fault(status=503, times=2, model="down"))
    status, headers, _ = await client.chat("degraded", hi, model="down")
    assert status == 200 and headers["x-agentproxy-degraded"] == "true"


async def guards(client: Client, n: int) -> None:
    # The loop ladder: warn, no_tools, then a block.
    history: list[dict[str, Any]] = [{"role": "user", "content": f"Summarize notes {n}."}]
    statuses = []
    for turn in range(7):
        if turn == 5:
            history.append({"role": "user", "content": "Try again."})
        status, _, body = await client.chat(
            "loops", history, model="stuck", session=f"stuck-{n}", tools=TOOLS[:1]
        )
        statuses.append(status)
        if status != 200:
            break
        message = {k: v for k, v in body["choices"][0]["message"].items() if v is not None}
        history.append(message)
        for tool_call in message.get("tool_calls") or []:
            history.append(result(tool_call["id"], "ENOENT"))
    assert statuses == [200] * 6 + [429], statuses

    # A budget of two calls per session: the third is refused.
    for attempt in range(3):
        status, _, body = await client.chat(
            "metered", [{"role": "user", "content": f"hi {attempt}"}], session=f"metered-{n}"
        )
    assert status == 429 and body["error"]["code"] == "budget_exceeded", body

    # A rate limit of one request a minute per session: the second is refused.
    for attempt in range(2):
        status, _, body = await client.chat(
            "limited", [{"role": "user", "content": f"hi {attempt}"}], session=f"limited-{n}"
        )
    assert status == 429 and body["error"]["code"] == "rate_limited", body

    # A client error, for the 4xx class.
    status, _, _ = await client.chat("rewrite", [{"role": "user", "content": "x"}], model="nope")
    assert status == 404


async def play_round(client: Client, sim: Simulator, path: Path, good: str, n: int) -> None:
    await reloads(client, path, good, n)
    await rewriting(client, n)
    await resilience(client, sim, n)
    await guards(client, n)


# --- dashboards' queries -------------------------------------------------------------------


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr with Grafana's variables filled in) for every target."""
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        variables = {v["name"] for v in dashboard["templating"]["list"]}
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                found.append((path.name, panel["title"], fill(target["expr"], variables)))
    return found


def fill(expr: str, variables: set[str]) -> str:
    """Grafana's interpolation, enough for a test: builtins get fixed durations, dashboard
    variables match everything (`.*`, as their All value does)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name in BUILTINS:
            return BUILTINS[name]
        if name in variables:
            return ".*"
        return match.group(0)  # not a variable (e.g. label_replace's ${1})

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]", value, expr)


def test_every_panel_has_queries_to_check() -> None:
    queries = dashboard_queries()
    assert len({q[0] for q in queries}) == 4 and len(queries) >= 40
    assert not [q for q in queries if "$__" in q[2]]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_every_dashboard_query_returns_data_from_a_real_prometheus(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    started = time.monotonic()
    sim, stuck = Simulator(), Simulator(responder=stubborn_model)
    sim_server = await aiohttp_server(sim.app())
    stuck_server = await aiohttp_server(stuck.app())
    path = tmp_path / "agentproxy.yaml"
    good = config_text(
        str(sim_server.make_url("")).rstrip("/"),
        str(stuck_server.make_url("")).rstrip("/"),
        tmp_path / "state",
        "round 0",
    )
    path.write_text(good)
    proxy = await start_proxy(path, watch=False)
    client = Client(proxy, http)

    prometheus = Prometheus(tmp_path, targets=[f"127.0.0.1:{proxy.port}"])
    prometheus.launch()  # boots while the first round plays
    try:
        await play_round(client, sim, path, good, 1)
        await prometheus.ready()
        await prometheus.wait_for_scrapes(1)  # every series of round 1 is known now
        await play_round(client, sim, path, good, 2)
        await prometheus.wait_for_scrapes(3)
        results = [
            (name, title, expr, await evaluate(prometheus, expr))
            for name, title, expr in dashboard_queries()
        ]
    finally:
        prometheus.close()

    failures = [
        f"{name} / {title}: {problem}  {expr}"
        for name, title, expr, (problem, _) in results
        if problem
    ]
    assert not failures, f"{len(failures)} of {len(results)} dashboard queries failed:\n" + (
        "\n".join(failures)
    )
    # Beyond "not empty": each panel shows the scenario's activity (some value above zero),
    # but those counting what should never happen.
    active: dict[tuple[str, str], bool] = {}
    for name, title, _, (_, values) in results:
        active[name, title] = active.get((name, title), False) or any(
            math.isfinite(v) and v > 0 for v in values
        )
    idle = [f"{name} / {title}" for (name, title), seen in active.items() if not seen]
    assert not [p for p in idle if p.split(" / ", 1)[1] not in ZERO_IS_FINE], (
        "panels showing no activity after the scenario:\n" + "\n".join(idle)
    )
    assert time.monotonic() - started < 40


async def evaluate(prometheus: Prometheus, expr: str) -> tuple[str, list[float]]:
    """(what is wrong, or "", the values of the result vector)."""
    try:
        result = await prometheus.aquery(expr)
    except AssertionError as error:
        return f"ERROR {error}", []
    if not result:
        return "EMPTY", []
    return "", [float(sample["value"][1]) for sample in result]
