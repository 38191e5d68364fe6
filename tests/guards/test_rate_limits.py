"""Rate limits over real sockets: a request past a limit is refused with 429 and Retry-After in
the client's wire format before any upstream call; each key, team and owner's session has a
window of its own; a slot is given back on every path, a cancelled stream included; limits
follow a reload, and an invalid block keeps the old ones."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory, sim_config

ALICE, BOB, CAROL = "sk-rate-alice", "sk-rate-bob", "sk-rate-carol"
ADMIN = "sk-rate-admin"
CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}


def keys(alice: str = "", bob: str = "") -> str:
    """Alice and Bob of team blue, Carol of none; `alice`, `bob`: their own limits."""

    def limits(given: str) -> str:
        return f", limits: {{{given}}}" if given else ""

    return textwrap.dedent(
        f"""\
        keys:
          admin_key: {ADMIN}
          api_keys:
            - {{name: alice, key: {ALICE}, team: blue{limits(alice)}}}
            - {{name: bob, key: {BOB}, team: blue{limits(bob)}}}
            - {{name: carol, key: {CAROL}}}
        """
    )


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator, aiohttp_server: Any, extra: str
) -> TestServer:
    upstream: TestServer = await aiohttp_server(sim.app())
    url = str(upstream.make_url("")).rstrip("/")
    path = tmp_path / "agentproxy.yaml"
    path.write_text(sim_config(url, f"store: {{path: {tmp_path}}}\n{extra}"))
    return await start_proxy(path)


async def chat(
    http: aiohttp.ClientSession,
    proxy: TestServer,
    key: str,
    session: str | None = None,
    body: dict[str, Any] | None = None,
) -> tuple[int, dict[str, str], Any]:
    headers = {"Authorization": f"Bearer {key}"}
    if session is not None:
        headers["x-agentproxy-session"] = session
    url = str(proxy.make_url("/v1/chat/completions"))
    async with http.post(url, json=body or CHAT, headers=headers) as response:
        return response.status, dict(response.headers), await response.json()


def upstream_calls(sim: Simulator) -> int:
    return len(sim.requests)


@pytest.fixture
def sim() -> Simulator:
    return Simulator(context_window=8192, api_key="sk-sim-upstream-secret")


async def test_a_key_past_its_rpm_gets_429_with_retry_after_before_any_upstream_call(
    start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator, aiohttp_server: Any
) -> None:
    proxy = await start(start_proxy, tmp_path, sim, aiohttp_server, keys(alice="rpm: 2"))
    async with aiohttp.ClientSession() as http:
        assert (await chat(http, proxy, ALICE))[0] == 200
        assert (await chat(http, proxy, ALICE))[0] == 200
        status, headers, body = await chat(http, proxy, ALICE)
        assert status == 429, body
        # Two requests a minute: the next one in 30 s.
        assert 25 <= int(headers["Retry-After"]) <= 30
        assert body["error"]["code"] == "rate_limited"
        assert body["error"]["rate_limit"] == {
            "scope": "key", "limit": "rpm", "value": 2,
            "retry_after_s": int(headers["Retry-After"]), "policy": "default",
        }  # fmt: skip
        assert "rate_limit.refused" in headers["x-agentproxy-applied"]
        assert upstream_calls(sim) == 2  # the refused request never left
        # The Anthropic wire: its own envelope, the same window.
        url = str(proxy.make_url("/v1/messages"))
        anthropic = {"model": "sim", "max_tokens": 16,
                     "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
        async with http.post(url, json=anthropic, headers={"x-api-key": ALICE}) as response:
            assert response.status == 429
            assert int(response.headers["Retry-After"]) >= 25
            shaped = await response.json()
        assert shaped["type"] == "error"
        assert shaped["error"]["type"] == "rate_limit_error"
        assert shaped["error"]["rate_limit"]["limit"] == "rpm"
        # Gemini's: RESOURCE_EXHAUSTED, the proxy's reason in an ErrorInfo.
        url = str(proxy.make_url("/v1beta/models/sim:generateContent"))
        gemini = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        async with http.post(url, json=gemini, headers={"x-goog-api-key": ALICE}) as response:
            assert response.status == 429
            assert int(response.headers["Retry-After"]) >= 25
            google = await response.json()
        assert google["error"]["status"] == "RESOURCE_EXHAUSTED"
        assert google["error"]["details"][0]["reason"] == "rate_limited"
        # Another key is a wall: its own window.
        assert (await chat(http, proxy, BOB))[0] == 200
        assert upstream_calls(sim) == 3
        async with http.get(str(proxy.make_url("/metrics"))) as response:
            metrics = await response.text()
    assert 'agentproxy_rate_limited_total{limit="rpm",scope="key"} 3.0' in metrics
    assert 'agentproxy_rate_limited_total{limit="tpm",scope="session"} 0.0' in metrics
    assert "alice" not in metrics.split("agentproxy_rate_limited_total")[1][:400]


async def test_a_session_window_is_its_owners_and_a_team_window_its_teams(
    start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator, aiohttp_server: Any
) -> None:
    policy = textwrap.dedent(
        """\
        policies:
          - name: agents
            limits:
              session: {rpm: 1}
              team: {rpm: 3}
        """
    )
    proxy = await start(start_proxy, tmp_path, sim, aiohttp_server, keys() + policy)
    async with aiohttp.ClientSession() as http:
        assert (await chat(http, proxy, ALICE, "shared-id"))[0] == 200
        status, _, body = await chat(http, proxy, ALICE, "shared-id")
        assert status == 429 and body["error"]["rate_limit"]["scope"] == "session"
        assert "shared-id" in body["error"]["message"]
        # Bob sends the same session id: another owner, another window.
        assert (await chat(http, proxy, BOB, "shared-id"))[0] == 200
        # Alice's other session has its own window, but her team (blue) is now at its 3.
        assert (await chat(http, proxy, ALICE, "other-id"))[0] == 200
        status, _, body = await chat(http, proxy, BOB, "third-id")
        assert status == 429 and body["error"]["rate_limit"]["scope"] == "team"
        # Carol has no team: a team of her own.
        assert (await chat(http, proxy, CAROL, "shared-id"))[0] == 200
    assert upstream_calls(sim) == 4


async def test_tpm_admits_on_the_estimate_and_charges_what_was_used(
    start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator, aiohttp_server: Any
) -> None:
    """The simulator counts four characters a token, as the admission estimate does: a
    request of ~700 tokens fits twice in a tpm of 1,500, not three times."""
    proxy = await start(start_proxy, tmp_path, sim, aiohttp_server, keys(alice="tpm: 1500"))
    big = {**CHAT, "messages": [{"role": "user", "content": "word " * 560}]}
    async with aiohttp.ClientSession() as http:
        assert (await chat(http, proxy, ALICE, body=big))[0] == 200
        assert (await chat(http, proxy, ALICE, body=big))[0] == 200
        status, headers, body = await chat(http, proxy, ALICE, body=big)
        assert status == 429, body
        assert body["error"]["rate_limit"]["limit"] == "tpm"
        # ~700 tokens short of room at 25 a second (prompt and completion were charged).
        assert 10 <= int(headers["Retry-After"]) <= 40
        # A small request fits what is left.
        status, _, body = await chat(http, proxy, ALICE)
        assert status == 200, body
    assert upstream_calls(sim) == 3


async def test_max_concurrent_slot_is_freed_by_a_cancelled_stream(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    sim = Simulator(context_window=8192, api_key="sk-sim-upstream-secret", chunk_delay_s=0.2)
    proxy = await start(start_proxy, tmp_path, sim, aiohttp_server, keys(alice="max_concurrent: 1"))
    url = str(proxy.make_url("/v1/chat/completions"))
    streamed = {**CHAT, "stream": True, "max_tokens": 200}
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {ALICE}"}
        response = await http.post(url, json=streamed, headers=headers)
        assert response.status == 200
        await response.content.readline()  # the stream began: its slot is held
        status, retry, body = await chat(http, proxy, ALICE)
        assert status == 429 and body["error"]["rate_limit"]["limit"] == "max_concurrent"
        assert retry["Retry-After"] == "1"
        response.close()  # the client leaves mid-stream
        for _ in range(50):  # the proxy sees the hang-up, cancels, gives the slot back
            await asyncio.sleep(0.05)
            status, _, body = await chat(http, proxy, ALICE)
            if status == 200:
                break
        assert status == 200, body
        # A stream that ends frees its slot too, and so does an upstream's error.
        async with http.post(url, json={**streamed, "max_tokens": 3}, headers=headers) as done:
            await done.read()
        assert (await chat(http, proxy, ALICE))[0] == 200
        failing = {**CHAT, "model": "sim", "messages": [{"role": "user", "content": "x"}],
                   "max_tokens": 100_000}  # fmt: skip
        status, _, _ = await chat(http, proxy, ALICE, body=failing)
        assert status >= 400
        assert (await chat(http, proxy, ALICE))[0] == 200


async def test_a_request_another_guard_refuses_gives_its_slot_back(
    start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator, aiohttp_server: Any
) -> None:
    policy = textwrap.dedent(
        """\
        policies:
          - name: agents
            limits: {key: {max_concurrent: 1}}
            budgets: [{name: two, scope: session, limits: {calls: 1}}]
        """
    )
    proxy = await start(start_proxy, tmp_path, sim, aiohttp_server, keys() + policy)
    async with aiohttp.ClientSession() as http:
        assert (await chat(http, proxy, ALICE, "s"))[0] == 200
        status, _, body = await chat(http, proxy, ALICE, "s")
        assert status == 429 and body["error"]["code"] == "budget_exceeded"
        assert (await chat(http, proxy, ALICE, "t"))[0] == 200  # the slot was given back


async def test_limits_follow_a_reload_and_an_invalid_block_keeps_the_old(
    start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator, aiohttp_server: Any
) -> None:
    upstream: TestServer = await aiohttp_server(sim.app())
    url = str(upstream.make_url("")).rstrip("/")
    path = tmp_path / "agentproxy.yaml"
    server = "server: {watch_interval_s: 0.1, reload_settle_s: 0.1}\n"

    def write(limits: str) -> None:
        path.write_text(server + sim_config(url, keys(alice=limits)))

    write("rpm: 1")
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession() as http:
        assert (await chat(http, proxy, ALICE))[0] == 200
        assert (await chat(http, proxy, ALICE))[0] == 429
        write("rpm: 1000")
        assert await reloaded(http, proxy, 1) is True
        assert (await chat(http, proxy, ALICE))[0] == 200  # the bigger bucket refills at once
        write("rpm: 0")  # invalid: the old limits stay
        assert await reloaded(http, proxy, 2) is False
        assert (await chat(http, proxy, ALICE))[0] == 200
        write("max_concurrent: 1, on_store_error: refuse, rpm: 1")
        assert await reloaded(http, proxy, 3) is True
        # The smaller bucket holds at most its own minute: one request, then a refusal.
        assert (await chat(http, proxy, ALICE))[0] == 200
        assert (await chat(http, proxy, ALICE))[0] == 429


async def reloaded(http: aiohttp.ClientSession, proxy: TestServer, count: int) -> bool:
    """Whether reload number `count` (counted in the metrics) was applied."""
    for _ in range(100):
        await asyncio.sleep(0.1)
        async with http.get(str(proxy.make_url("/metrics"))) as response:
            text = await response.text()
        done = {
            result: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            for result in ("success", "failure")
            if line.startswith(f'agentproxy_config_reloads_total{{result="{result}"}}')
        }
        if sum(done.values()) >= count:
            headers = {"Authorization": f"Bearer {ADMIN}"}
            async with http.get(str(proxy.make_url("/admin/policies")), headers=headers) as r:
                shown = await r.json()
            return bool(shown["last_reload"]["ok"])
    raise AssertionError(f"reload {count} never happened")


async def test_the_sdks_see_their_own_rate_limit_error(
    start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator, aiohttp_server: Any
) -> None:
    """The real openai and anthropic SDKs raise their RateLimitError, Retry-After readable."""
    import anthropic
    import openai

    proxy = await start(start_proxy, tmp_path, sim, aiohttp_server, keys(alice="rpm: 1"))
    chat_sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key=ALICE, max_retries=0)
    messages_sdk = anthropic.AsyncAnthropic(
        base_url=str(proxy.make_url("")).rstrip("/"), api_key=ALICE, max_retries=0
    )
    try:
        await chat_sdk.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
        with pytest.raises(openai.RateLimitError) as refused:
            await chat_sdk.chat.completions.create(
                model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=8
            )
        assert int(refused.value.response.headers["retry-after"]) >= 55
        assert refused.value.code == "rate_limited"
        with pytest.raises(anthropic.RateLimitError) as shaped:
            await messages_sdk.messages.create(
                model="sim", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        assert int(shaped.value.response.headers["retry-after"]) >= 55
    finally:
        await chat_sdk.close()
        await messages_sdk.close()
    assert upstream_calls(sim) == 1
