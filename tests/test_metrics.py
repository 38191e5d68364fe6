"""/metrics after real traffic: Prometheus' own linter accepts it, and no label carries a
session id, a key, a request id or message text."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import Metrics
from proxy.sim.simulator import Fault, Simulator
from tests.conftest import ProxyFactory, sim_config
from tests.deploy.prometheus import binary

# Strings a client controls; none may reach a label (unbounded cardinality, and a leak).
SESSION = "sess-Zq7distinctive-0042"
PARENT = "parent-Zq7distinctive-0043"
KEY = "sk-proxy-Zq7secret-9931"
TEAM_KEY = "sk-proxy-Zq7secret-team-5512"
REQUEST_ID = "req-Zq7distinctive-0044"
USER = "user-Zq7distinctive-0045"
TEXT = "purple elephants Zq7 ate the quarterly report"
TOOL_ARG = "notes-Zq7distinctive.md"
UPSTREAM_KEY = "sk-sim-upstream-secret"
SECRETS = (SESSION, PARENT, KEY, TEAM_KEY, REQUEST_ID, USER, TEXT, TOOL_ARG, UPSTREAM_KEY, "Zq7")

EXTRA = f"""
keys:
  admin_key: admin-Zq7secret
  api_keys:
    - {{name: coding-agent, key: {KEY}, team: platform}}
    - {{name: batch, key: {TEAM_KEY}}}
policies:
  - name: everything
    offload: {{min_tokens: 300}}
    retry: {{attempts: 3, base_s: 0.01, cap_s: 0.02}}
    loops: {{enabled: true, window: 5, repeats: 3}}
    budgets:
      - {{name: per-session, scope: session, limits: {{calls: 4}}, soft: 0.5}}
      - {{name: per-key, scope: key, window: day, limits: {{tokens: 1000000, cost_usd: 5}}}}
      - {{name: per-team, scope: team, limits: {{calls: 1000}}}}
"""


async def drive(proxy: TestServer, sim: Simulator) -> str:
    """Traffic touching every labelled family, with client-chosen strings everywhere; then
    the exposition text."""
    chat = str(proxy.make_url("/v1/chat/completions"))
    headers = {
        "Authorization": f"Bearer {KEY}",
        "x-agentproxy-session": SESSION,
        "x-agentproxy-parent-session": PARENT,
        "x-request-id": REQUEST_ID,
    }
    call = {
        "id": "call_Zq7distinctive",
        "type": "function",
        "function": {"name": "read_file", "arguments": f'{{"path": "{TOOL_ARG}"}}'},
    }
    big = "\n".join(f"{TEXT} line {i}" for i in range(300))
    bodies: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": TEXT}], "user": USER},
        {"messages": [{"role": "user", "content": TEXT}], "stream": True},
        {
            "messages": [
                {"role": "user", "content": TEXT},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": big},
                {"role": "user", "content": f"{TEXT}, again"},
            ],
            "metadata": {"session_id": SESSION},
        },
        {"messages": [{"role": "user", "content": f"{TEXT} (after a 503)"}]},
        {"messages": [{"role": "user", "content": TEXT}]},  # over the session budget
    ]
    async with aiohttp.ClientSession() as http:
        for number, body in enumerate(bodies):
            if number == 3:
                sim.inject(Fault(status=503))
            async with http.post(chat, json={"model": "sim", **body}, headers=headers) as r:
                await r.read()
        # Refused before any upstream call: a bad key, an unknown model, a malformed body.
        hi: dict[str, Any] = {"messages": [{"role": "user", "content": TEXT}]}
        statuses = []
        for extra_headers, body in (
            ({"Authorization": f"Bearer {KEY}-wrong"}, {"model": "sim"}),
            ({"Authorization": f"Bearer {TEAM_KEY}"}, {"model": f"model-{SESSION}", **hi}),
            ({"Authorization": f"Bearer {TEAM_KEY}"}, {"model": "sim", "messages": TEXT}),
        ):
            async with http.post(chat, json=body, headers=extra_headers) as r:
                statuses.append(r.status)
        assert statuses == [401, 404, 400]
        async with http.post(
            str(proxy.make_url("/admin/reload")), headers={"Authorization": "Bearer wrong"}
        ) as r:
            assert r.status == 401
        async with http.get(str(proxy.make_url("/metrics"))) as r:
            assert r.status == 200
            return await r.text()


@pytest.fixture
async def exposition(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator
) -> str:
    upstream = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    url = str(upstream.make_url("")).rstrip("/")
    path.write_text(sim_config(url, f"store: {{path: {tmp_path / 'state'}}}\n{EXTRA}"))
    proxy = await start_proxy(path, watch=False)
    return await drive(proxy, sim)


async def test_promtool_accepts_the_exposition(exposition: str) -> None:
    assert "agentproxy_requests_total{" in exposition
    assert 'agentproxy_tokens_saved_total{stage="offload"}' in exposition  # traffic happened
    checked = await asyncio.to_thread(
        subprocess.run,
        [binary("promtool"), "check", "metrics"],
        input=exposition.encode(),
        capture_output=True,
        timeout=30,
    )
    output = (checked.stdout + checked.stderr).decode()
    assert checked.returncode == 0 and not output.strip(), output


async def test_no_label_carries_client_strings_or_secrets(exposition: str) -> None:
    for secret in SECRETS:
        assert secret not in exposition
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            for label, value in sample.labels.items():
                labels.setdefault(f"{family.name}.{label}", set()).add(value)
    for where, values in labels.items():
        for value in values:
            # Names from the config, codes, routes, versions: short, and never prose.
            assert len(value) <= 64 and " " not in value, f"{where}={value!r}"
    # The model label holds configured aliases only, even for a request naming another.
    models = set().union(*(v for k, v in labels.items() if k.endswith(".model")))
    assert models <= {"sim", "-", "unknown"}, models


async def test_every_memo_reports_its_size_within_its_bound(exposition: str) -> None:
    sizes = dict(re.findall(r'agentproxy_memo_bytes\{memo="(\w+)"\} (\S+)', exposition))
    bounds = dict(re.findall(r'agentproxy_memo_capacity_bytes\{memo="(\w+)"\} (\S+)', exposition))
    assert set(sizes) == set(bounds) >= {"histories", "offload_turns", "compaction_histories"}
    assert float(sizes["histories"]) > 0  # the scenario's sessions are remembered...
    assert all(float(sizes[m]) <= float(bounds[m]) for m in sizes)  # ...within bounds


async def test_server_memo_mb_sets_the_memos_bounds(proxy_for: Any) -> None:
    proxy = await proxy_for(Simulator(), "server: {memo_mb: 8}\n")
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url("/metrics")) as response:
            text = await response.text()
    bounds = dict(re.findall(r'agentproxy_memo_capacity_bytes\{memo="(\w+)"\} (\S+)', text))
    assert float(bounds["histories"]) == 0.25 * 8 * 1024 * 1024
    assert float(bounds["loop_calls"]) == 0.015625 * 8 * 1024 * 1024
    memos = [float(v) for name, v in bounds.items() if not name.startswith("state_")]
    assert sum(memos) <= 8 * 1024 * 1024
    # The guards' state (the embedded store's) has its own bound, outside memo_mb.
    assert float(bounds["state_values"]) + float(bounds["state_counters"]) == 32 * 1024 * 1024


def test_docs_metrics_lists_every_metric_and_no_other() -> None:
    exported = set()
    for family in Metrics().registry.collect():
        if family.name.startswith("agentproxy_"):  # process_* are the client library's own
            exported.add(family.name + ("_total" if family.type == "counter" else ""))
    table = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    assert set(re.findall(r"^\| `(agentproxy_\w+)`", table, flags=re.MULTILINE)) == exported
