"""A budget with `on_exhausted: {model: ALIAS}`, through the real proxy over real sockets: once
its limit is reached the request is served by the cheaper alias instead of refused (JSON and
streamed; chat, Messages, Responses), noted in x-agentproxy-applied, the event log and the
metrics, still charged to the same budgets (a hard cap without on_exhausted refuses as
before), and only for the scope that spent it: another key sending the same session id is
served as asked."""

from __future__ import annotations

import calendar
import re
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Fault, Simulator
from proxy.state import EVENTS, FLOW
from tests.conftest import REDIS_URL, ProxyFactory, base_url

ALICE, BOB = "sk-alice-0001", "sk-bob-0002"
UPSTREAM_KEY = "sk-sim-upstream-secret"


def config(url: str, state: Path, models: str = "", store: str = "", gpt: str = "") -> str:
    """`big` and `small` (chat, Responses), `claude-big` and `claude-small` (Messages), each
    family under a policy whose session budget moves it to the small one after one call."""
    up = UPSTREAM_KEY
    store = store or f"{{path: {state}}}"
    text = f"""\
        store: {store}
        keys:
          api_keys:
            - {{name: alice, key: {ALICE}, team: red{models}}}
            - {{name: bob, key: {BOB}, team: blue}}
        model_list:
          - model_name: big
            litellm_params: {{model: openai/big-model, api_base: {url}/v1, api_key: {up}}}
            model_info: {{max_input_tokens: 8192}}
          - model_name: small
            litellm_params: {{model: openai/small-model, api_base: {url}/v1, api_key: {up}}}
            model_info: {{max_input_tokens: 4096}}
          - model_name: claude-big
            litellm_params: {{model: anthropic/claude-big, api_base: {url}, api_key: {up}}}
          - model_name: claude-small
            litellm_params: {{model: anthropic/claude-small, api_base: {url}, api_key: {up}}}
        policies:
          - name: gpt
            match: {{models: [big, small]}}{gpt}
            budgets:
              - name: premium
                window: month
                limits: {{calls: 1}}
                on_exhausted: {{model: small}}
              - {{name: hard, limits: {{calls: 3}}}}
          - name: claude
            match: {{models: [claude-big, claude-small]}}
            budgets:
              - name: premium
                window: month
                limits: {{calls: 1}}
                on_exhausted: {{model: claude-small}}
        """
    return textwrap.dedent(text)


@pytest.fixture
async def served(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> tuple[TestServer, Simulator, Path]:
    sim = Simulator()
    upstream = await aiohttp_server(sim.app())
    state = tmp_path / "state"
    path = tmp_path / "downgrade.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), state))
    return await start_proxy(path), sim, state


def chat(proxy: TestServer, key: str = ALICE) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(proxy), api_key=key, max_retries=0)


async def ask(proxy: TestServer, session: str, key: str = ALICE, **body: Any) -> Any:
    return await chat(proxy, key).chat.completions.with_raw_response.create(
        model="big",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-agentproxy-session": session},
        **body,
    )


def models_sent(sim: Simulator) -> list[str]:
    return [request.body.get("model", "") for request in sim.requests]


async def test_chat_is_served_by_the_cheaper_alias_once_the_budget_is_spent(
    served: tuple[TestServer, Simulator, Path],
) -> None:
    proxy, sim, state = served
    first = await ask(proxy, "agent-1")
    assert first.headers["x-agentproxy-model"] == "big"
    assert "budget.downgraded" not in first.headers.get("x-agentproxy-applied", "")
    second = await ask(proxy, "agent-1")
    assert second.headers["x-agentproxy-model"] == "small"
    assert "budget.downgraded" in second.headers["x-agentproxy-applied"]
    # The answer's model is what served it, as after a fallback (the provider's id).
    assert second.parse().model == "small-model"
    assert models_sent(sim) == ["big-model", "small-model"]

    # Still charged to the same budgets: `hard` (3 calls, no on_exhausted) refuses the fourth.
    await ask(proxy, "agent-1")
    with pytest.raises(openai.RateLimitError) as caught:
        await ask(proxy, "agent-1")
    body = caught.value.body
    assert isinstance(body, dict) and body["budget"]["name"] == "hard"
    applied = caught.value.response.headers["x-agentproxy-applied"]
    assert "budget.downgraded" in applied and "budget.refused" in applied
    assert len(sim.requests) == 3

    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url("/metrics")) as response:
            metrics = await response.text()
    counted = re.search(
        r'agentproxy_decisions_total\{action="downgraded",guard="budget"\} (\S+)', metrics
    )
    assert counted is not None and float(counted.group(1)) == 3  # the refused one too
    proxy.app[EVENTS].flush()
    with (state / "events.jsonl").open() as lines:
        events = [orjson.loads(line) for line in lines]
    moved = [e for e in events if (e["stage"], e["action"]) == ("budget", "downgraded")]
    assert len(moved) == 3
    assert moved[0]["budget"] == "premium" and moved[0]["model"] == "big"
    assert moved[0]["to"] == "small" and moved[0]["limit"] == "calls"


async def test_a_streamed_request_is_downgraded(
    served: tuple[TestServer, Simulator, Path],
) -> None:
    proxy, sim, _ = served
    await ask(proxy, "streamer")
    raw = await ask(proxy, "streamer", stream=True)
    assert raw.headers["x-agentproxy-model"] == "small"
    assert "budget.downgraded" in raw.headers["x-agentproxy-applied"]
    chunks = [chunk async for chunk in raw.parse()]
    assert {chunk.model for chunk in chunks} == {"small-model"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert models_sent(sim) == ["big-model", "small-model"]


async def test_messages_are_served_by_the_cheaper_alias(
    served: tuple[TestServer, Simulator, Path],
) -> None:
    proxy, sim, _ = served
    client = anthropic.AsyncAnthropic(
        base_url=str(proxy.make_url("")).rstrip("/"), api_key=ALICE, max_retries=0
    )
    headers = {"x-agentproxy-session": "claude-agent"}
    replies = []
    for _ in range(2):
        replies.append(
            await client.messages.with_raw_response.create(
                model="claude-big",
                max_tokens=64,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers=headers,
            )
        )
    assert replies[0].headers["x-agentproxy-model"] == "claude-big"
    assert replies[1].headers["x-agentproxy-model"] == "claude-small"
    assert "budget.downgraded" in replies[1].headers["x-agentproxy-applied"]
    assert (await replies[1].parse()).model == "claude-small"
    assert [r.path for r in sim.requests] == ["/v1/messages", "/v1/messages"]
    assert models_sent(sim) == ["claude-big", "claude-small"]
    # Streamed, in Messages' events.
    async with client.messages.stream(
        model="claude-big",
        max_tokens=64,
        messages=[{"role": "user", "content": "again"}],
        extra_headers=headers,
    ) as stream:
        message = await stream.get_final_message()
    assert message.model == "claude-small"
    await client.close()


async def test_responses_are_served_by_the_cheaper_alias(
    served: tuple[TestServer, Simulator, Path],
) -> None:
    proxy, sim, _ = served
    client = chat(proxy)
    headers = {"x-agentproxy-session": "codex"}
    for _ in range(2):
        raw = await client.responses.with_raw_response.create(
            model="big", input="hi", extra_headers=headers
        )
    assert raw.headers["x-agentproxy-model"] == "small"
    assert "budget.downgraded" in raw.headers["x-agentproxy-applied"]
    assert models_sent(sim) == ["big-model", "small-model"]
    assert {r.path for r in sim.requests} == {"/v1/responses"}


async def test_another_key_with_the_same_session_id_is_not_downgraded(
    served: tuple[TestServer, Simulator, Path],
) -> None:
    proxy, sim, _ = served
    await ask(proxy, "shared-name")
    alice = await ask(proxy, "shared-name")
    assert alice.headers["x-agentproxy-model"] == "small"
    bob = await ask(proxy, "shared-name", key=BOB)
    assert bob.headers["x-agentproxy-model"] == "big"
    assert "budget.downgraded" not in bob.headers.get("x-agentproxy-applied", "")
    assert models_sent(sim) == ["big-model", "small-model", "big-model"]


async def test_a_key_that_may_not_use_the_cheaper_alias_is_named_at_load(
    tmp_path: Path,
) -> None:
    from proxy.policies.loader import ConfigError, load_config

    path = tmp_path / "barred.yaml"
    path.write_text(config("http://127.0.0.1:9", tmp_path, models=", models: [big]"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "policies[0].budgets[0].on_exhausted.model" in message
    assert "alice" in message and "'small'" in message


async def test_the_history_is_fitted_again_to_the_cheaper_window(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """A history that fits the dear alias' window but not the cheap one's is compacted for
    the cheap one before it is sent (as for a fallback): no overflow is ever answered."""
    big, small = Simulator(context_window=32_000), Simulator(context_window=1_500)
    urls = {}
    for name, sim in (("big", big), ("small", small)):
        urls[name] = str((await aiohttp_server(sim.app())).make_url("")).rstrip("/")
    path = tmp_path / "windows.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            store: {{path: {tmp_path / "state"}}}
            model_list:
              - model_name: big
                litellm_params: {{model: openai/big, api_base: {urls["big"]}/v1}}
                model_info: {{max_input_tokens: 32000}}
              - model_name: small
                litellm_params: {{model: openai/small, api_base: {urls["small"]}/v1}}
                model_info: {{max_input_tokens: 1500}}
            policies:
              - name: metered
                budgets:
                  - {{name: premium, limits: {{calls: 1}}, on_exhausted: {{model: small}}}}
            """
        )
    )
    proxy = await start_proxy(path)
    history: list[dict[str, str]] = []
    for turn in range(16):
        history.append({"role": "user", "content": f"Step {turn}: " + "go on with it. " * 40})
        history.append({"role": "assistant", "content": f"Done {turn}. " + "all fine. " * 40})
    history.append({"role": "user", "content": "Now sum it up."})
    client = chat(proxy)
    headers = {"x-agentproxy-session": "long"}
    await client.chat.completions.create(
        model="big", messages=[{"role": "user", "content": "start"}], extra_headers=headers
    )
    raw = await client.chat.completions.with_raw_response.create(
        model="big", messages=history, extra_headers=headers
    )
    applied = raw.headers["x-agentproxy-applied"]
    assert raw.headers["x-agentproxy-model"] == "small" and "budget.downgraded" in applied
    assert "compaction." in applied
    assert len(big.requests) == 1
    asked = [r for r in small.requests if r.body["messages"][-1]["content"] == "Now sum it up."]
    assert len(asked) == 1 and len(asked[0].body["messages"]) < len(history)
    assert all(r.status == 200 for r in small.requests)  # fitted before, not after an overflow


async def test_replicas_on_one_redis_share_the_month_and_the_downgrade(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, redis_prefix: str
) -> None:
    """The month's counters live in Redis under a key of their own, expiring a day after the
    month: what one replica charged downgrades the next request on the other."""
    import redis

    sim = Simulator()
    url = str((await aiohttp_server(sim.app())).make_url("")).rstrip("/")
    store = f"{{backend: redis, url: '{REDIS_URL}', prefix: '{redis_prefix}'}}"
    now = float(calendar.timegm((2026, 12, 31, 12, 0, 0)))
    replicas = []
    for name in ("a", "b"):
        path = tmp_path / f"replica-{name}.yaml"
        path.write_text(config(url, tmp_path / name, store=store))
        replica = await start_proxy(path)
        replica.app[FLOW].rewriter.budgets.clock = lambda: now
        replicas.append(replica)
    first = await ask(replicas[0], "shared")
    assert first.headers["x-agentproxy-model"] == "big"
    second = await ask(replicas[1], "shared")
    assert second.headers["x-agentproxy-model"] == "small"
    assert models_sent(sim) == ["big-model", "small-model"]

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = [k.decode() for k in client.scan_iter(match=redis_prefix + "*premium*")]
        month = calendar.timegm((2026, 12, 1, 0, 0, 0))
        assert len(keys) == 1 and keys[0].endswith(f"|month:{month}")
        ttl = client.pttl(keys[0]) / 1000
        assert 12 * 3600 + 86400 - 60 < ttl <= 12 * 3600 + 86400
    finally:
        client.close()


async def test_a_fallback_to_the_dear_alias_is_downgraded_back(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """The fallback's re-fit meets the spent budget too: the chain from `small` to `big` is
    sent back to `small`, and `big` is never called past the budget."""
    sim = Simulator()
    url = str((await aiohttp_server(sim.app())).make_url("")).rstrip("/")
    path = tmp_path / "fallback.yaml"
    gpt = """
            retry: {attempts: 1}
            fallbacks: [{from: small, to: [big]}]"""
    path.write_text(config(url, tmp_path / "state", gpt=gpt))
    proxy = await start_proxy(path)
    await ask(proxy, "falling")  # the premium budget's one call
    sim.inject(Fault(status=503, model="small-model", times=2))
    with pytest.raises(openai.InternalServerError) as caught:
        await chat(proxy).chat.completions.create(
            model="small",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-agentproxy-session": "falling"},
        )
    applied = caught.value.response.headers["x-agentproxy-applied"]
    assert "fallback.fell_back" in applied and "budget.downgraded" in applied
    assert models_sent(sim) == ["big-model", "small-model", "small-model"]
