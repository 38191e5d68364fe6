"""The guard's placeholders are the deployment's, not a replica's: two proxies on one real
Redis, in one test process, over real sockets. A secret in a tool result gets the same
placeholder from either replica, so a session whose turns the load balancer spreads sends
the provider the same prefix every turn (its prompt cache holds); a second key sending the
same secret gets another (tenants are walls); replicas started again on the same store keep
them (the key is kept there, and put back by the running replicas if Redis lost it). The same
holds for one process on its SQLite store across a restart. And the documented limit: a
history kept at the provider gets back only what its replica scrubbed."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis
from aiohttp.test_utils import TestServer

from proxy.guards.secrets import placeholders as minting
from proxy.guards.secrets import shared_key
from proxy.guards.secrets.placeholders import Minter
from proxy.guards.secrets.shared_key import SharedKey
from proxy.sim.simulator import Simulator
from proxy.store.base import StoreError
from tests.conftest import REDIS_URL, ProxyFactory

KEY, OTHER = "sk-proxy-replica-1", "sk-proxy-replica-2"
UPSTREAM_KEY = "sk-sim-up-replicas"
AWS = "AKIAIOSFODNN7EXAMPLE"
FILE = f"# .env\nAWS_ACCESS_KEY_ID={AWS}\nDEBUG=true\n"
PLACEHOLDER = re.compile(r"«secret:[0-9a-f]{12}»")
READ = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}


def echoing_model(body: dict[str, Any]) -> dict[str, Any]:
    """Answers with the placeholders it was sent, as an agent's model would use them."""
    found = sorted(set(PLACEHOLDER.findall(orjson.dumps(body["messages"]).decode())))
    return {"role": "assistant", "content": "using " + " and ".join(found or ["nothing"])}


@pytest.fixture
def sim() -> Simulator:
    return Simulator(context_window=32768, api_key=UPSTREAM_KEY, responder=echoing_model)


def config(tmp_path: Path, upstream: TestServer, store: str) -> Path:
    url = str(upstream.make_url("")).rstrip("/")
    text = f"""\
        store: {store}
        keys:
          api_keys: [{{name: agent, key: {KEY}}}, {{name: other, key: {OTHER}}}]
        model_list:
          - model_name: gpt-sim
            litellm_params: {{model: openai/sim, api_base: {url}/v1, api_key: {UPSTREAM_KEY}}}
        policies:
          - name: guarded
            guard: {{secrets: {{scrub: true}}}}
        """
    path = tmp_path / "guard-replicas.yaml"
    path.write_text(textwrap.dedent(text))
    return path


async def start_process(
    start_proxy: ProxyFactory, path: Path, monkeypatch: pytest.MonkeyPatch
) -> TestServer:
    """A proxy as a process of its own starts it: with the key a process draws at import
    (the replicas of this test share one interpreter, so each is given its own)."""
    monkeypatch.setattr(minting, "PROCESS_KEY", os.urandom(32))
    return await start_proxy(path)


def redis_store(prefix: str) -> str:
    return f"{{backend: redis, url: {REDIS_URL}, prefix: '{prefix}'}}"


def turn_one() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "read .env"},
        {"role": "assistant", "content": None, "tool_calls": [READ]},
        {"role": "tool", "tool_call_id": "c1", "content": FILE},
    ]


async def ask(proxy: TestServer, key: str, messages: list[dict[str, Any]]) -> str:
    headers = {"authorization": f"Bearer {key}", "x-agentproxy-session": "spread-1"}
    body = {"model": "gpt-sim", "messages": messages}
    url = proxy.make_url("/v1/chat/completions")
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            answer: str = (await r.json())["choices"][0]["message"]["content"]
            return answer


def sent(sim: Simulator, index: int = -1) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = sim.requests[index].body["messages"]
    return messages


def placeholders(messages: list[dict[str, Any]]) -> list[str]:
    return PLACEHOLDER.findall(orjson.dumps(messages).decode())


async def test_a_session_spread_over_replicas_sends_one_placeholder_for_a_secret(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim: Simulator,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = config(tmp_path, await aiohttp_server(sim.app()), redis_store(redis_prefix))
    a = await start_process(start_proxy, path, monkeypatch)
    b = await start_process(start_proxy, path, monkeypatch)
    history = turn_one()
    answer = await ask(a, KEY, history)  # turn 1: replica A scrubs the tool result
    assert AWS in answer  # given back
    first = sent(sim)
    assert AWS not in orjson.dumps(first).decode()
    (placeholder,) = set(placeholders(first))
    history += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "now deploy with it"},
    ]
    answer = await ask(b, KEY, history)  # turn 2, the same history and more: replica B
    second = sent(sim)
    # What the provider holds cached is the prefix of what it gets next, byte for byte.
    assert orjson.dumps(second[: len(first)]) == orjson.dumps(first)
    assert set(placeholders(second)) == {placeholder}
    assert AWS in answer and placeholder not in answer  # B gives back what A scrubbed

    # A second key sending the same secret (and the same session id) gets another.
    theirs = await ask(b, OTHER, turn_one())
    (other,) = set(placeholders(sent(sim)))
    assert other != placeholder
    await ask(a, OTHER, turn_one())
    assert set(placeholders(sent(sim))) == {other}
    assert AWS in theirs


async def test_replicas_started_again_on_the_store_keep_the_placeholders(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim: Simulator,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    upstream = await aiohttp_server(sim.app())
    path = config(tmp_path, upstream, redis_store(redis_prefix))
    a = await start_process(start_proxy, path, monkeypatch)
    b = await start_process(start_proxy, path, monkeypatch)
    await ask(a, KEY, turn_one())
    before = placeholders(sent(sim))
    await a.close()
    await b.close()
    a = await start_process(start_proxy, path, monkeypatch)
    b = await start_process(start_proxy, path, monkeypatch)  # a restart of both
    await ask(b, KEY, turn_one())
    assert placeholders(sent(sim)) == before
    await ask(a, KEY, turn_one())
    assert placeholders(sent(sim)) == before


async def test_one_process_on_its_sqlite_store_keeps_them_across_a_restart(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim: Simulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = config(tmp_path, await aiohttp_server(sim.app()), f"{{path: {tmp_path / 'state'}}}")
    proxy = await start_process(start_proxy, path, monkeypatch)
    await ask(proxy, KEY, turn_one())
    before = placeholders(sent(sim))
    await proxy.close()
    proxy = await start_process(start_proxy, path, monkeypatch)
    await ask(proxy, KEY, turn_one())
    assert placeholders(sent(sim)) == before


class _Records:
    """Admin records whose store fails until told otherwise, holding another replica's key."""

    def __init__(self) -> None:
        self.kept = os.urandom(32)
        self.failing = True

    async def placeholder_key(self, drawn: bytes) -> bytes:
        if self.failing:
            raise StoreError("redis 127.0.0.1:6379: placeholder_key failed: refused")
        return self.kept


async def test_a_store_failing_at_start_leaves_the_process_key_until_it_answers(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared_key, "RETRY_S", 0.01)
    minter, records = Minter(), _Records()
    process = minter.placeholder("key:agent", AWS)
    shared = SharedKey(records, minter)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, "agentproxy.guard"):
        assert not await shared.load()
        assert not await shared.load()  # warned once
        assert minter.placeholder("key:agent", AWS) == process  # the process's own, meanwhile
        records.failing = False
        await shared.follow(keep=False)  # returns once the store answered
    assert minter.placeholder("key:agent", AWS) == Minter(records.kept).placeholder(
        "key:agent", AWS
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "process's own" in warnings[0]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert records.kept.hex() not in said and minter.key.hex() not in said and AWS not in said
    records.failing = True  # a store down later: the key read stays
    assert await shared.load()
    assert minter.key == records.kept


async def test_a_key_the_store_lost_is_put_back_by_the_running_replicas(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim: Simulator,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis restarted without its data (or evicted the key): a replica started after that
    must not draw a key of its own while the others mint from theirs."""
    monkeypatch.setattr(shared_key, "KEEP_S", 0.05)
    path = config(tmp_path, await aiohttp_server(sim.app()), redis_store(redis_prefix))
    a = await start_process(start_proxy, path, monkeypatch)
    await ask(a, KEY, turn_one())
    before = placeholders(sent(sim))
    client = redis.Redis.from_url(REDIS_URL)
    assert client.delete(redis_prefix + "guard:placeholder_key") == 1
    await asyncio.sleep(0.3)  # A asks again, and puts its key back
    client.close()
    c = await start_process(start_proxy, path, monkeypatch)
    await ask(c, KEY, turn_one())
    assert placeholders(sent(sim)) == before


class RememberingModel:
    """A provider that keeps the conversation (`previous_response_id`): its model may quote a
    placeholder it was sent on an earlier turn, which this turn's request does not hold."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.seen |= set(PLACEHOLDER.findall(orjson.dumps(body["messages"]).decode()))
        return {"role": "assistant", "content": "using " + " and ".join(sorted(self.seen))}


async def respond(proxy: TestServer, body: dict[str, Any]) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {KEY}", "x-agentproxy-session": "kept-1"}
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.make_url("/v1/responses"), json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            answer: dict[str, Any] = await r.json()
            return answer


def output_text(answer: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in answer["output"]
        if item.get("type") == "message"
        for part in item["content"]
    )


async def test_a_history_kept_at_the_provider_gets_back_only_what_its_replica_scrubbed(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The documented limit: the map back to the secrets is held in the memory of the replica
    that scrubbed them, never in the store. A later turn continuing a `previous_response_id`
    sends only its new input, so another replica has no secret to map the model's quote back
    to: the client gets the placeholder as the model wrote it (never someone else's secret);
    the replica that scrubbed it gives it back."""
    sim = Simulator(context_window=32768, api_key=UPSTREAM_KEY, responder=RememberingModel())
    path = config(tmp_path, await aiohttp_server(sim.app()), redis_store(redis_prefix))
    a = await start_process(start_proxy, path, monkeypatch)
    b = await start_process(start_proxy, path, monkeypatch)
    first = await respond(a, {"model": "gpt-sim", "input": f"here is .env:\n{FILE}"})
    assert AWS in output_text(first)
    (placeholder,) = placeholders(sim.requests[-1].body["input"])
    again = {"model": "gpt-sim", "previous_response_id": first["id"], "input": "the key?"}
    assert AWS in output_text(await respond(a, again))  # the replica that holds the map
    elsewhere = output_text(await respond(b, again))
    assert placeholder in elsewhere and AWS not in elsewhere
