"""A local llama-cpp-python server behind the proxy, over real sockets, driven by the openai SDK:
its upstream is the simulator with llama-cpp-python's quirks (tests/support/sim_llama.py), so
these tests fail the way the real server made the proxy fail (issue 15)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.request_id import is_uuid
from proxy.sim.simulator import Fault
from tests.conftest import ProxyFactory, base_url
from tests.support.sim_llama import LlamaCppSimulator

ALICE, BOB = "sk-alice-0123456789", "sk-bob-0123456789"
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "read_log",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


async def start(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim: LlamaCppSimulator,
    model_info: str = "",
    policy: str = "",
) -> TestServer:
    upstream = await aiohttp_server(sim.app())
    url = str(upstream.make_url("/v1"))
    path = tmp_path / "llama.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            store: {{path: {tmp_path / "state"}}}
            keys:
              api_keys:
                - {{name: alice, key: {ALICE}}}
                - {{name: bob, key: {BOB}}}
            model_list:
              - model_name: local
                litellm_params: {{model: openai/smollm2, api_base: "{url}"}}
                model_info: {{max_input_tokens: 2048{model_info}}}
            policies:
              - name: p
                retry: {{base_s: 0.01, cap_s: 0.02}}
            """
        )
        + textwrap.indent(textwrap.dedent(policy), "    ")
    )
    return await start_proxy(path)


def client(proxy: TestServer, key: str = ALICE) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(proxy), api_key=key, max_retries=0)


async def tool_turns(ai: openai.AsyncOpenAI, session: str) -> tuple[Any, list[Any]]:
    """A first turn that calls the tool, then the SDK's own assistant message sent back (its
    content is None) with the tool's result: (the raw second response, the history)."""
    history: list[Any] = [{"role": "user", "content": "GOAL: find the error. read_log it"}]
    headers = {"x-agentproxy-session": session}
    first = await ai.chat.completions.create(
        model="local", messages=history, tools=TOOLS, extra_headers=headers
    )
    message = first.choices[0].message
    assert message.tool_calls and message.content is None
    history.append(message.model_dump(exclude_unset=True))  # what agents send back
    assert history[-1]["content"] is None
    history.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "ok"})
    raw = await ai.chat.completions.with_raw_response.create(
        model="local", messages=history, tools=TOOLS, extra_headers=headers
    )
    return raw, history


# --- request ids ----------------------------------------------------------------------------


async def test_requests_get_through_with_a_uuid_request_id(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = LlamaCppSimulator()
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim)
    raw = await client(proxy).chat.completions.with_raw_response.create(
        model="local", messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.http_response.status_code == 200
    sent = sim.requests[-1].headers["x-request-id"]
    assert is_uuid(sent) and raw.headers["x-request-id"] == sent


async def test_a_clients_own_id_is_echoed_but_sent_upstream_only_if_uuid_shaped(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = LlamaCppSimulator()
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim)
    hi = [{"role": "user", "content": "hi"}]
    for given, forwarded in (("trace-42", False), ("6f1c0e52-4a8e-4d7c-9b1e-2f5a7c3d9e10", True)):
        raw = await client(proxy).chat.completions.with_raw_response.create(
            model="local", messages=hi, extra_headers={"x-request-id": given}
        )
        assert raw.http_response.status_code == 200 and raw.headers["x-request-id"] == given
        assert ("x-request-id" in sim.requests[-1].headers) is forwarded


async def test_an_empty_error_body_still_says_who_answered_and_what_to_check(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = LlamaCppSimulator()
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim)
    sim.inject(Fault(status=400, body=""))  # as llama-cpp-python refuses a bad request id
    with pytest.raises(openai.BadRequestError) as caught:
        await client(proxy).chat.completions.create(
            model="local", messages=[{"role": "user", "content": "hi"}]
        )
    message = caught.value.message
    api_base = (tmp_path / "llama.yaml").read_text().split('api_base: "')[1].split('"')[0]
    assert f"the upstream for 'local' (openai/smollm2 at {api_base}) answered HTTP 400" in message
    assert "with an empty body" in message and "check that api_base points at" in message
    body: Any = caught.value.body
    assert body["request_id"] == caught.value.response.headers["x-request-id"]


# --- content: null --------------------------------------------------------------------------


async def test_a_null_content_refusal_teaches_the_shim_once_for_every_tenant(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = LlamaCppSimulator()
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim)
    raw, _ = await tool_turns(client(proxy), "s1")
    assert raw.http_response.status_code == 200
    assert "compat.emptied_null_content;count=1" in raw.headers["x-agentproxy-applied"]
    refused, accepted = sim.requests[-2], sim.requests[-1]
    assert refused.status == 500 and refused.body["messages"][1]["content"] is None
    assert accepted.status == 200 and accepted.body["messages"][1]["content"] == ""
    assert len(sim.requests) == 3  # the first turn, the refusal, the shimmed one: no retries
    # Learnt for the deployment: another tenant's request is shimmed before it is sent.
    before = len(sim.requests)
    raw, _ = await tool_turns(client(proxy, BOB), "s1")
    assert raw.http_response.status_code == 200
    assert [r.status for r in sim.requests[before:]] == [200, 200]


async def test_a_declared_deployment_is_shimmed_from_its_first_request(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = LlamaCppSimulator()
    info = ", supports_null_content: false"
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, model_info=info)
    raw, _ = await tool_turns(client(proxy), "s1")
    assert raw.http_response.status_code == 200
    assert [r.status for r in sim.requests] == [200, 200]


async def test_a_validation_500_is_not_retried_and_opens_no_circuit(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """A deployment declared to take null contents (wrongly): the refusal passes through,
    after one call, as the request's own fault; other sessions go on."""
    sim = LlamaCppSimulator()
    info = ", supports_null_content: true"
    policy = "circuit: {failures: 2}\n"
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, info, policy)
    ai = client(proxy)
    for _ in range(3):
        before = len(sim.requests)
        with pytest.raises(openai.InternalServerError) as caught:
            await tool_turns(ai, "bad")
        assert [r.status for r in sim.requests[before:]] == [200, 500]  # no retry
        error: Any = caught.value.body
        assert error["type"] == "internal_server_error"  # the server's own, unchanged:
        assert "guidance" not in error and "attempts" not in error  # nothing was retried
        assert "validation error" in error["message"]
    reply = await ai.chat.completions.create(
        model="local",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-agentproxy-session": "other"},
    )
    assert reply.choices[0].message.content == "You said: hi"


# --- one bad request and the deployment's circuit ------------------------------------------


def poisoned(chat: dict[str, Any]) -> dict[str, Any]:
    """A model server that crashes (a plain 500) on one request, every time it sees it."""
    if "poison" in str(chat["messages"][-1].get("content")):
        raise RuntimeError("template crashed")
    return {"role": "assistant", "content": "fine"}


async def say(
    http: aiohttp.ClientSession, proxy: TestServer, session: str, text: str, key: str = ALICE
) -> int:
    body = {"model": "local", "messages": [{"role": "user", "content": text}]}
    headers = {"authorization": f"Bearer {key}", "x-agentproxy-session": session}
    async with http.post(base_url(proxy) + "/chat/completions", json=body, headers=headers) as r:
        return r.status


async def test_one_sessions_bad_request_does_not_open_the_circuit_for_others(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = LlamaCppSimulator(responder=poisoned)
    policy = "circuit: {failures: 3, cooldown_s: 30}\n"
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, policy=policy)
    async with aiohttp.ClientSession() as http:
        for _ in range(3):  # 9 failed calls, all from one session's request
            assert await say(http, proxy, "a", "poison") == 500
        assert len(sim.requests) == 9
        assert await say(http, proxy, "b", "hello") == 200
        for session in ("c", "d"):  # Alice's other sessions: still one tenant
            assert await say(http, proxy, session, "poison") == 500
        # The same failure seen by Bob too, every tenant there is: the deployment's.
        assert await say(http, proxy, "d", "poison", key=BOB) == 503  # opened at its first
        assert await say(http, proxy, "b", "hello") == 503


def recalling(chat: dict[str, Any]) -> dict[str, Any]:
    """Asked about the archive, the model calls the proxy's recall tool (content: None)."""
    last = chat["messages"][-1]
    if last["role"] == "tool" and last.get("tool_call_id") == "call_recall":
        return {"role": "assistant", "content": "found it"}
    if any(t["function"]["name"] == "agentproxy_recall" for t in chat.get("tools") or []):
        function = {"name": "agentproxy_recall", "arguments": '{"query": "needle"}'}
        call = {"id": "call_recall", "type": "function", "function": function}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": "ok"}


async def test_a_recall_round_is_shimmed_before_it_is_sent(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = LlamaCppSimulator(responder=recalling)
    info = ", supports_null_content: false"
    policy = "offload: {min_tokens: 100}\n"
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, info, policy)
    call = {"id": "c1", "type": "function", "function": {"name": "read_log", "arguments": "{}"}}
    history: Any = [
        {"role": "user", "content": "read the log"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "a needle in a log\n" * 200},
        {"role": "user", "content": "where is the needle?"},
    ]
    reply = await client(proxy).chat.completions.create(
        model="local", messages=history, tools=TOOLS
    )
    assert reply.choices[0].message.content == "found it"
    assert [r.status for r in sim.requests] == [200, 200]  # no refusal to recover from
    recall_turn = sim.requests[1].body["messages"][-2]
    assert recall_turn["tool_calls"][0]["id"] == "call_recall" and recall_turn["content"] == ""
