"""One tenant filling the store stops only itself: with two keys, each may hold half of
store.max_mb. Key A sends large tool results until its share is full; from then on its own
offloads are refused (its requests still answered, with the results inline, and saying so),
while key B's offloads go on: its pointer reaches the provider and its blob is readable."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import REDIS_URL, ProxyFactory, sim_config

ALICE = {"Authorization": "Bearer sk-alice-0001"}
BOB = {"Authorization": "Bearer sk-bob-0002"}
BIG = "".join(f"row {n}: value {n * 7}\n" for n in range(2_000))  # ~40 KB, ~10k tokens
REF = re.compile(r"reference: (ap_[0-9a-f]{24})")


def config(sim_url: str, store: str) -> str:
    extra = textwrap.dedent(
        f"""\
        keys:
          api_keys:
            - {{name: alice, key: sk-alice-0001}}
            - {{name: bob, key: sk-bob-0002}}
        store: {{{store}, max_mb: 1, live_s: 3600}}
        policies:
          - name: offloading
            offload: {{min_tokens: 2000}}
        """
    )
    return sim_config(sim_url, extra, window=200_000)


async def turn(
    http: aiohttp.ClientSession, proxy: TestServer, key: dict[str, str], session: str
) -> tuple[int, str, Any]:
    """One turn whose tool result (new for each session) is large enough to offload."""
    call = {"id": "c1", "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "big.txt"}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": f"file {session}\n{BIG}"},
    ]
    body = {"model": "sim", "messages": messages}
    headers = {**key, "x-agentproxy-session": session}
    async with http.post(proxy.make_url("/v1/chat/completions"), json=body, headers=headers) as r:
        return r.status, r.headers.get("x-agentproxy-applied", ""), await r.json()


def sent_tool_result(sim: Simulator) -> str:
    """The tool message the provider received last."""
    return str(sim.requests[-1].body["messages"][-1]["content"])


@pytest.fixture(params=["local", "redis"])
def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    where = f"path: {tmp_path / 'data'}"  # the local store's, and the event log's
    if request.param == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        return f'{where}, backend: redis, url: "{REDIS_URL}", prefix: "{prefix}"'
    return where


async def test_a_tenant_filling_its_share_stops_only_itself(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, store_config: str
) -> None:
    sim = Simulator(context_window=200_000)  # answers whole requests too: degraded, not lost
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), store_config))
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession() as http:
        alice_refs: list[str] = []
        for index in range(60):  # ~40 KB each: half of 1 MiB holds about a dozen
            status, applied, _ = await turn(http, proxy, ALICE, f"a{index}")
            assert status == 200, "alice's requests are answered, full share or not"
            if "offload.store_failed" in applied:
                break
            assert "offload.offloaded" in applied
            found = REF.search(sent_tool_result(sim))
            assert found
            alice_refs.append(found.group(1))
        else:
            raise AssertionError("60 offloads of ~40 KB never filled alice's share")
        # Degraded and visible: the result went to the provider whole.
        assert sent_tool_result(sim).endswith(BIG)
        status, applied, _ = await turn(http, proxy, ALICE, "a-more")
        assert status == 200 and "offload.store_failed" in applied

        for index in range(3):  # bob's offloads go on
            status, applied, _ = await turn(http, proxy, BOB, f"b{index}")
            assert status == 200 and "offload.offloaded" in applied, applied
            pointer = sent_tool_result(sim)
            assert pointer.startswith("[agentproxy] This tool result was offloaded")
            found = REF.search(pointer)
            assert found
            url = proxy.make_url(f"/v1/agentproxy/archive/{found.group(1)}")
            async with http.get(url, headers=BOB) as r:
                assert r.status == 200
                assert (await r.json())["content"] == f"file b{index}\n{BIG}"

        assert 5 <= len(alice_refs) <= 16, "alice got about half of the store"
        # Nothing of alice's live sessions was lost to make room.
        for ref in alice_refs:
            async with http.get(
                proxy.make_url(f"/v1/agentproxy/archive/{ref}"), headers=ALICE
            ) as r:
                assert r.status == 200

        async with http.get(proxy.make_url("/metrics")) as r:
            metrics = await r.text()
        refused = re.search(r"^agentproxy_store_owner_full_total (\S+)$", metrics, re.M)
        assert refused and float(refused.group(1)) >= 2
        assert "agentproxy_store_owner_share 0.5" in metrics

    events = (tmp_path / "data" / "events.jsonl").read_text()
    assert '"store_failed"' in events and "OwnerFull" in events and "key:alice" in events


async def test_an_overflow_after_a_refused_offload_names_the_keys_share(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    """A model too small for the result inline: the overflow error says the key's own share
    is full, not the store, and what helps."""
    sim = Simulator(context_window=4_000)
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), f"path: {tmp_path}"))
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession() as http:
        for index in range(60):
            status, applied, body = await turn(http, proxy, ALICE, f"a{index}")
            if status != 200:
                break
            assert "offload.offloaded" in applied
        else:
            raise AssertionError("60 offloads of ~40 KB never filled alice's share")
        assert status == 400 and "offload.store_failed" in applied
        error = body["error"]
        assert error["code"] == "context_length_exceeded"
        assert "share for this key (or team) is full" in error["store_error"]
        assert "store.max_owner_share" in error["guidance"]
        status, applied, _ = await turn(http, proxy, BOB, "b0")
        assert status == 200 and "offload.offloaded" in applied
