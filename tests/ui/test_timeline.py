"""What the inspector reads, over real sockets with an admin key configured: the sessions
list scoped by key (the admin sees every tenant, a client key its own, no key nothing), and a
recorded turn's archived items beside what the model saw instead (an offload's pointer)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from proxy.state import RECORDINGS
from tests.conftest import ProxyFactory

ADMIN, ALICE, BOB = "admin-secret", "sk-alice-0001", "sk-bob-00002"
BIG = "\n".join(f"line {i}: the full tool output" for i in range(400))


async def start(start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path) -> TestServer:
    upstream: TestServer = await aiohttp_server(Simulator(context_window=50_000).app())
    url = str(upstream.make_url("")).rstrip("/")
    path = tmp_path / "agentproxy.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            keys:
              admin_key: {ADMIN}
              api_keys: [{{name: alice, key: {ALICE}}}, {{name: bob, key: {BOB}}}]
            store: {{path: {tmp_path / "data"}}}
            model_list:
              - model_name: sim
                litellm_params: {{model: openai/sim, api_base: "{url}/v1"}}
            policies:
              - name: recorded
                record: {{enabled: true}}
                offload: {{min_tokens: 500}}
            """
        )
    )
    return await start_proxy(path)


async def ask(proxy: TestServer, key: str, messages: list[dict[str, Any]]) -> None:
    headers = {"Authorization": f"Bearer {key}", "x-agentproxy-session": "shared"}
    async with aiohttp.ClientSession() as http:
        url, body = proxy.make_url("/v1/chat/completions"), {"model": "sim", "messages": messages}
        async with http.post(url, json=body, headers=headers) as r:
            assert r.status == 200, await r.text()


async def get(proxy: TestServer, path: str, key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url(path), headers=headers) as r:
            return r.status, await r.json()


async def test_the_admin_sees_every_tenant_a_client_key_its_own_no_key_nothing(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path)
    await ask(proxy, ALICE, [{"role": "user", "content": "alice's plan"}])
    await ask(proxy, BOB, [{"role": "user", "content": "bob's plan"}])  # the same session id
    assert (await get(proxy, "/admin/sessions"))[0] == 401  # loopback too: there is a key
    _, everyone = await get(proxy, "/admin/sessions", ADMIN)
    ids = {row["key"]: row["id"] for row in everyone["data"]}
    assert set(ids) == {"alice", "bob"}
    _, alices = await get(proxy, "/admin/sessions", ALICE)
    assert [(row["session"], row["key"]) for row in alices["data"]] == [("shared", "alice")]
    assert (await get(proxy, f"/admin/sessions/{ids['bob']}", ALICE))[0] == 404
    assert (await get(proxy, f"/admin/sessions/{ids['bob']}", ADMIN))[0] == 200
    assert (await get(proxy, f"/admin/sessions/{ids['alice']}"))[0] == 401


async def test_an_offload_shows_its_ref_the_archived_text_and_the_pointer_the_model_saw(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path)
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    await ask(
        proxy, ALICE,
        [{"role": "user", "content": "read it"},
         {"role": "assistant", "content": None, "tool_calls": [call]},
         {"role": "tool", "tool_call_id": "c1", "content": BIG}],
    )  # fmt: skip
    await proxy.app[RECORDINGS].flush()
    _, listed = await get(proxy, "/admin/sessions", ADMIN)
    _, shown = await get(proxy, f"/admin/sessions/{listed['data'][0]['id']}", ADMIN)
    [event] = [e for e in shown["timeline"][0]["events"] if e["stage"] == "offload"]
    [ref] = event["refs"]
    assert ref in event["seen"][ref] and "line 0: the full tool output" in event["seen"][ref]
    assert "line 200:" not in event["seen"][ref]  # a preview, not the whole
    status, archived = await get(proxy, f"/v1/agentproxy/archive/{ref}", ADMIN)
    assert status == 200 and archived["content"] == BIG  # the admin reads alice's archive
    assert (await get(proxy, f"/v1/agentproxy/archive/{ref}", BOB))[0] == 404
