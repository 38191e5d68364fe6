"""POST /v1/messages through the real proxy with the `anthropic` SDK, over real sockets,
against the strict Anthropic twin: JSON and streams, tool loops, repairs, offload, overflow,
thinking blocks returned untouched, and errors in Anthropic's envelope."""

from __future__ import annotations

import asyncio
import re
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory

KEY = "sk-proxy-anthropic-1"
UPSTREAM_KEY = "sk-sim-upstream-secret"
TOOLS: list[Any] = [
    {
        "name": "read_file",
        "description": "Read a file",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
        "cache_control": {"type": "ephemeral"},
    }
]
ASK = {"role": "user", "content": 'read_file({"path": "notes.txt"})'}
THINKING = {"type": "enabled", "budget_tokens": 1024}


async def start(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    *,
    window: int = 8192,
    policies: str = "",
    prices: str = "",
) -> TestServer:
    url = str(upstream.make_url("")).rstrip("/")
    text = f"""\
        store: {{path: {tmp_path / "state"}}}
        keys:
          api_keys: [{{name: agent, key: {KEY}}}]
        model_list:
          - model_name: claude
            litellm_params:
              model: anthropic/claude-sim
              api_base: {url}
              api_key: {UPSTREAM_KEY}
            model_info:
              max_input_tokens: {window}{prices}
        """
    path = tmp_path / "anthropic.yaml"
    path.write_text(textwrap.dedent(text) + textwrap.dedent(policies))
    return await start_proxy(path)


OPENED: list[anthropic.AsyncAnthropic] = []


def client(proxy: TestServer, key: str = KEY) -> anthropic.AsyncAnthropic:
    sdk = anthropic.AsyncAnthropic(
        base_url=str(proxy.make_url("")).rstrip("/"), api_key=key, max_retries=0
    )
    OPENED.append(sdk)
    return sdk


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while OPENED:
        await OPENED.pop().close()


@pytest.fixture
def sim() -> Simulator:
    return Simulator(api_key=UPSTREAM_KEY)


@pytest.fixture
async def proxy(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, sim: Simulator
) -> TestServer:
    return await start(start_proxy, tmp_path, await aiohttp_server(sim.app()))


async def test_a_message_goes_through_natively(proxy: TestServer, sim: Simulator) -> None:
    raw = await client(proxy).messages.with_raw_response.create(
        model="claude",
        max_tokens=256,
        messages=[{"role": "user", "content": "hello there"}],
        extra_headers={"x-claude-code-session-id": "cc-1", "anthropic-beta": "beta-x"},
    )
    message = await raw.parse()
    assert message.content[0].text == "You said: hello there"  # type: ignore[union-attr]
    assert raw.headers["x-agentproxy-session"] == "cc-1"
    sent = sim.requests[-1]
    assert sent.path == "/v1/messages"
    assert sent.api_key == UPSTREAM_KEY  # the provider's key, never the client's
    assert sent.headers["anthropic-beta"] == "beta-x"
    assert sent.body["model"] == "claude-sim"


async def test_a_stream_arrives_in_anthropics_event_order(proxy: TestServer) -> None:
    async with client(proxy).messages.stream(
        model="claude", max_tokens=256, messages=[{"role": "user", "content": "one two three"}]
    ) as stream:
        names = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert final.content[0].text == "You said: one two three"  # type: ignore[union-attr]
    assert final.usage.output_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_dangling_tool_use_is_repaired_before_the_provider_sees_it(
    proxy: TestServer, sim: Simulator, stream: bool
) -> None:
    history: list[Any] = [
        ASK,
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}}
            ],
        },
        {"role": "user", "content": "never mind, just say hi"},
    ]
    sdk = client(proxy)
    if stream:
        async with sdk.messages.stream(
            model="claude", max_tokens=256, messages=history, tools=TOOLS
        ) as events:
            message = await events.get_final_message()
    else:
        message = await sdk.messages.create(
            model="claude", max_tokens=256, messages=history, tools=TOOLS
        )
    assert message.content[0].text.startswith("You said")  # type: ignore[union-attr]
    sent = sim.requests[-1].body["messages"]
    assert sent[2]["content"][0]["type"] == "tool_result"
    assert sent[2]["content"][0]["is_error"] is True
    assert sent[2]["content"][1] == {"type": "text", "text": "never mind, just say hi"}
    assert sim.requests[-1].body["tools"][0] == TOOLS[0]  # cache_control and all


async def test_a_huge_tool_result_is_offloaded_and_readable(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, sim: Simulator
) -> None:
    policies = """
    policies:
      - name: tight
        offload: {min_tokens: 500}
    """
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), policies=policies)
    content = "\n".join(f"line {i}: filler text for the test" for i in range(600))
    history: list[Any] = [
        ASK,
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": content,
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]
    raw = await client(proxy).messages.with_raw_response.create(
        model="claude", max_tokens=256, messages=history, tools=TOOLS
    )
    assert "offload.offloaded;count=1" in raw.headers["x-agentproxy-applied"]
    body = sim.requests[-1].body
    result = body["messages"][2]["content"][0]
    assert result["cache_control"] == {"type": "ephemeral"}
    ref = re.search(r"reference: (ap_\w+)", result["content"]).group(1)  # type: ignore[union-attr]
    assert any(t["name"] == "agentproxy_recall" for t in body["tools"])
    async with aiohttp.ClientSession() as http:
        url = str(proxy.make_url(f"/v1/agentproxy/archive/{ref}"))
        async with http.get(url, headers={"x-api-key": KEY}) as r:
            assert r.status == 200 and (await r.json())["content"] == content


async def test_an_overflow_is_compacted_and_retried(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    sim = Simulator(api_key=UPSTREAM_KEY, context_window=3000)
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), window=100_000)
    history: list[Any] = [{"role": "user", "content": "Port the parser to Rust."}]
    for i in range(12):
        call = {
            "type": "tool_use",
            "id": f"toolu_{i}",
            "name": "read_file",
            "input": {"path": f"m{i}"},
        }
        history.append({"role": "assistant", "content": [call]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "x = 1\n" * 200}
        history.append({"role": "user", "content": [result]})
    raw = await client(proxy).messages.with_raw_response.create(
        model="claude", max_tokens=256, messages=history, tools=TOOLS
    )
    assert raw.http_response.status_code == 200
    assert "compaction.overflow_compacted" in raw.headers["x-agentproxy-applied"]
    assert any(r.status == 400 for r in sim.requests)  # "prompt is too long", recovered
    assert len(sim.requests[-1].body["messages"]) < len(history)


@pytest.mark.parametrize("stream", [False, True])
async def test_thinking_blocks_go_back_untouched(
    proxy: TestServer, sim: Simulator, stream: bool
) -> None:
    """A tool loop with thinking on: the twin checks every signature it minted."""
    sdk = client(proxy)
    first = await sdk.messages.create(
        model="claude", max_tokens=2048, thinking=THINKING, messages=[ASK], tools=TOOLS
    )
    assert first.content[0].type == "thinking"
    use = next(b for b in first.content if b.type == "tool_use")
    history: list[Any] = [
        ASK,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "notes: hi"}],
        },
    ]
    if stream:
        async with sdk.messages.stream(
            model="claude", max_tokens=2048, thinking=THINKING, messages=history, tools=TOOLS
        ) as events:
            second = await events.get_final_message()
    else:
        second = await sdk.messages.create(
            model="claude", max_tokens=2048, thinking=THINKING, messages=history, tools=TOOLS
        )
    assert sim.requests[-1].status == 200
    assert sim.requests[-1].body["messages"][1] == history[1]
    assert any(b.type == "text" for b in second.content)


HI = [{"role": "user", "content": "x"}]
INVALID = "invalid_request_error"


def body(**fields: Any) -> bytes:
    return orjson.dumps({"model": "claude", "max_tokens": 5, "messages": HI, **fields})


BAD_INPUT: dict[str, tuple[bytes, int, str]] = {
    "truncated JSON": (b'{"model": "claude", "max_tok', 400, INVALID),
    "not an object": (b"[1, 2]", 400, INVALID),
    "no max_tokens": (body(max_tokens=None), 400, INVALID),
    "empty messages": (body(messages=[]), 400, INVALID),
    "wrong role": (body(messages=[{"role": "bot", "content": "x"}]), 400, INVALID),
    "blocks not objects": (body(messages=[{"role": "user", "content": [1]}]), 400, INVALID),
    "unknown model": (body(model="gpt-9"), 404, "not_found_error"),
}


@pytest.mark.parametrize("raw, status, kind", BAD_INPUT.values(), ids=list(BAD_INPUT))
async def test_bad_input_gets_an_anthropic_error_and_the_next_request_succeeds(
    proxy: TestServer, raw: bytes, status: int, kind: str
) -> None:
    url = str(proxy.make_url("/v1/messages?beta=true"))
    headers = {"x-api-key": KEY, "content-type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=raw, headers=headers) as r:
            assert r.status == status
            body = await r.json()
        assert body["type"] == "error" and body["error"]["type"] == kind
        assert body["error"]["message"] and body["request_id"]
        async with http.post(url, headers={"x-api-key": "sk-wrong"}, json={}) as r:
            assert r.status == 401
            assert (await r.json())["error"]["type"] == "authentication_error"
    message = await client(proxy).messages.create(
        model="claude", max_tokens=64, messages=[{"role": "user", "content": "still here?"}]
    )
    assert message.content[0].text == "You said: still here?"  # type: ignore[union-attr]


async def test_an_anthropic_sdk_error_is_raised_as_its_own_type(proxy: TestServer) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        await client(proxy).messages.create(
            model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert "not configured" in str(caught.value)
    with pytest.raises(anthropic.AuthenticationError):
        await client(proxy, key="sk-nobody").messages.create(
            model="claude", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )


async def test_count_tokens_answers_an_estimate(proxy: TestServer) -> None:
    counted = await client(proxy).messages.count_tokens(
        model="claude", messages=[{"role": "user", "content": "hello " * 100}]
    )
    assert 100 <= counted.input_tokens <= 400


def recalling_model(body: dict[str, Any]) -> dict[str, Any]:
    """Looks the offloaded file up through the proxy's tool, then answers from it."""
    messages = body["messages"]
    last = messages[-1]
    if last.get("role") == "tool" and str(last.get("tool_call_id", "")).startswith("toolu_r"):
        return {"role": "assistant", "content": f"FOUND: {str(last['content'])[:40]}"}
    pointer = next(m for m in messages if "reference: ap_" in str(m.get("content")))
    ref = re.search(r"reference: (ap_\w+)", str(pointer["content"])).group(1)  # type: ignore[union-attr]
    function = {"name": "agentproxy_recall", "arguments": f'{{"ref": "{ref}"}}'}
    call = {"id": "toolu_r1", "type": "function", "function": function}
    return {"role": "assistant", "content": "Let me look.", "tool_calls": [call]}


@pytest.mark.parametrize("stream", [False, True])
async def test_recall_is_answered_inside_the_proxy(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, stream: bool
) -> None:
    sim = Simulator(api_key=UPSTREAM_KEY, responder=recalling_model)
    policies = "policies:\n  - name: tight\n    offload: {min_tokens: 500}\n"
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), policies=policies)
    content = "\n".join(f"line {i}: the launch code is PINEAPPLE" for i in range(600))
    use = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": content}
    history: list[Any] = [
        ASK,
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    sdk = client(proxy)
    if stream:
        async with sdk.messages.stream(
            model="claude", max_tokens=256, messages=history, tools=TOOLS
        ) as events:
            seen = [event.type async for event in events]
            message = await events.get_final_message()
        assert seen.count("message_start") == 1 and seen[-1] == "message_stop"
    else:
        message = await sdk.messages.create(
            model="claude", max_tokens=256, messages=history, tools=TOOLS
        )
    texts = [b.text for b in message.content if b.type == "text"]
    assert texts[-1].startswith("FOUND: line 0: the launch code is PINEAPPLE")
    if stream:  # what went out before the held call stays; the next round is numbered on
        assert texts == ["Let me look.", texts[-1]]
    assert all(b.type != "tool_use" for b in message.content)  # the client never sees it
    assert message.stop_reason == "end_turn"
    second = sim.requests[-1].body["messages"]
    assert second[-2]["content"][-1]["name"] == "agentproxy_recall"  # sent back whole
    assert second[-1]["content"][0]["tool_use_id"] == "toolu_r1"


@pytest.mark.parametrize("stream", [False, True])
async def test_an_openai_deployment_answers_an_anthropic_client(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, stream: bool
) -> None:
    """Translated: the view goes out as Chat Completions, the reply comes back in Anthropic's
    shape (streamed as Anthropic's events once whole)."""
    sim = Simulator()
    url = str((await aiohttp_server(sim.app())).make_url("")).rstrip("/")
    config = tmp_path / "translated.yaml"
    config.write_text(
        f"store: {{path: {tmp_path / 'state'}}}\n"
        f"model_list:\n  - model_name: gpt-ish\n    litellm_params:\n"
        f"      model: openai/gpt-sim\n      api_base: {url}/v1\n"
    )
    proxy = await start_proxy(config)
    sdk = client(proxy, key="unused")
    messages: list[Any] = [ASK]
    if stream:
        async with sdk.messages.stream(
            model="gpt-ish", max_tokens=256, messages=messages, tools=TOOLS
        ) as events:
            message = await events.get_final_message()
    else:
        message = await sdk.messages.create(
            model="gpt-ish", max_tokens=256, messages=messages, tools=TOOLS
        )
    use = next(b for b in message.content if b.type == "tool_use")
    assert use.name == "read_file" and use.input == {"path": "notes.txt"}
    assert message.stop_reason == "tool_use"
    sent = sim.requests[-1]
    assert sent.path == "/v1/chat/completions" and "stream" not in sent.body
    assert sent.body["tools"][0]["function"]["name"] == "read_file"
    assert "native" not in sent.body["tools"][0]


async def test_the_sync_sdk_works_too(proxy: TestServer) -> None:
    """The sync client, in a thread (the proxy serves on this test's event loop)."""
    url = str(proxy.make_url("")).rstrip("/")

    def talk() -> tuple[str, str]:
        with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as sdk:
            hi = [{"role": "user", "content": "sync hello"}]
            message = sdk.messages.create(model="claude", max_tokens=64, messages=hi)  # type: ignore[arg-type]
            with sdk.messages.stream(model="claude", max_tokens=64, messages=hi) as events:  # type: ignore[arg-type]
                streamed = events.get_final_message()
        return message.content[0].text, streamed.content[0].text  # type: ignore[union-attr]

    whole, streamed = await asyncio.to_thread(talk)
    assert whole == streamed == "You said: sync hello"


async def test_prompt_cache_reads_are_counted_and_priced_at_their_rate(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, sim: Simulator
) -> None:
    prices = (
        "\n              input_cost_per_token: 3.0e-6"
        "\n              output_cost_per_token: 1.5e-5"
        "\n              cache_read_input_token_cost: 3.0e-7"
        "\n              cache_creation_input_token_cost: 3.75e-6"
    )
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), prices=prices)
    system = [{"type": "text", "text": "Rules. " * 1500, "cache_control": {"type": "ephemeral"}}]
    sdk = client(proxy)
    for turn in range(3):
        await sdk.messages.create(
            model="claude",
            max_tokens=64,
            system=system,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": f"turn {turn}"}],
        )
    async with aiohttp.ClientSession() as http:
        async with http.get(str(proxy.make_url("/metrics"))) as r:
            text = await r.text()

    def metric(name: str, **labels: str) -> float:
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
            if match and ",".join(sorted(match.group(1).split(","))) == wanted:
                return float(match.group(2))
        return 0.0

    read = metric("agentproxy_prompt_tokens_total", model="claude", kind="cache_read")
    written = metric("agentproxy_prompt_tokens_total", model="claude", kind="cache_write")
    uncached = metric("agentproxy_prompt_tokens_total", model="claude", kind="uncached")
    assert read > 0 and written > 0  # the first turn wrote the prefix, the next two read it
    completion = metric("agentproxy_tokens_total", model="claude", kind="completion")
    expected = uncached * 3e-6 + read * 3e-7 + written * 3.75e-6 + completion * 1.5e-5
    assert metric("agentproxy_cost_usd_total", model="claude") == pytest.approx(expected)
    full = (uncached + read + written) * 3e-6 + completion * 1.5e-5
    assert expected < full  # a cache-heavy session costs less than at the full input rate


@pytest.mark.parametrize("stream", [False, True])
async def test_a_degraded_answer_is_a_message_the_client_reads(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, sim: Simulator, stream: bool
) -> None:
    from proxy.sim.simulator import Fault

    policy = "policies:\n  - name: calm\n    degraded: true\n    retry: {attempts: 1}\n"
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), policies=policy)
    sim.inject(Fault(status=529))
    sdk = client(proxy)
    hi: Any = [{"role": "user", "content": "hi"}]
    if stream:
        async with sdk.messages.stream(model="claude", max_tokens=64, messages=hi) as events:
            message = await events.get_final_message()
    else:
        message = await sdk.messages.create(model="claude", max_tokens=64, messages=hi)
    text = message.content[0].text  # type: ignore[union-attr]
    assert text.startswith("[agentproxy] The model is unavailable right now")
