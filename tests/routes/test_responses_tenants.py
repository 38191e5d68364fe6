"""Tenants share the operator's provider account, so a Responses id is a handle to a stored
conversation: key B, given key A's `resp_...` id, must not continue or read it. Every test plays
the attack over real sockets with the `openai` SDK against the Responses twin, which (like
OpenAI) continues any response it stored for whoever names it; the proxy answers B as the
provider answers an unknown id, and the upstream hears nothing of B's attempt."""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import REDIS_URL, OwnRedis, ProxyFactory, start_redis

ALICE, BOB, CAROL = "sk-alice-0001", "sk-bob-0002", "sk-carol-0003"
UPSTREAM_KEY = "sk-sim-upstream-secret"
OPENED: list[openai.AsyncOpenAI] = []


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while OPENED:
        await OPENED.pop().close()


@pytest.fixture
def sim() -> Simulator:
    return Simulator(api_key=UPSTREAM_KEY)


@pytest.fixture
async def upstream(aiohttp_server: Any, sim: Simulator) -> TestServer:
    server: TestServer = await aiohttp_server(sim.app())
    return server


@pytest.fixture(params=["local", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return f"store: {{path: {tmp_path / 'state'}}}"
    prefix = request.getfixturevalue("redis_prefix")
    return f"store: {{backend: redis, url: {REDIS_URL}, prefix: '{prefix}'}}"


def config(upstream: TestServer, store: str, keys: str | None) -> str:
    url = str(upstream.make_url("")).rstrip("/")
    text = f"""\
        {store}
        model_list:
          - model_name: gpt
            litellm_params:
              model: openai/gpt-sim
              api_base: {url}/v1
              api_key: {UPSTREAM_KEY}
        """
    return textwrap.dedent(text) + textwrap.dedent(keys or "")


KEYS = f"""\
        keys:
          session_scope: team
          api_keys:
            - {{name: alice, key: {ALICE}, team: red}}
            - {{name: bob, key: {BOB}, team: blue}}
            - {{name: carol, key: {CAROL}, team: red}}
        """


async def start(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    store: str,
    keys: str | None = KEYS,
) -> TestServer:
    path = tmp_path / "responses-tenants.yaml"
    path.write_text(config(upstream, store, keys))
    return await start_proxy(path)


def client(proxy: TestServer, key: str) -> openai.AsyncOpenAI:
    sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key=key, max_retries=0)
    OPENED.append(sdk)
    return sdk


async def create(proxy: TestServer, key: str, stream: bool, **body: Any) -> Any:
    sdk = client(proxy, key)
    if stream:
        async with sdk.responses.stream(model="gpt", **body) as events:
            async for _ in events:
                pass
            return await events.get_final_response()
    return await sdk.responses.create(model="gpt", **body)


async def refused(proxy: TestServer, key: str, stream: bool, **body: Any) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        await create(proxy, key, stream, **body)
    return caught.value


def provider_answer(sim_error: openai.APIStatusError) -> tuple[int, dict[str, Any]]:
    body = sim_error.body
    assert isinstance(body, dict)
    return sim_error.status_code, {k: body[k] for k in ("message", "type", "param", "code")}


def shown(error: openai.APIStatusError, response_id: str) -> dict[str, Any]:
    """An error's body with the id it names and its request id taken out."""
    assert isinstance(error.body, dict)
    body = {k: v for k, v in error.body.items() if k != "request_id"}
    body["message"] = body["message"].replace(response_id, "<id>")
    return body


@pytest.mark.parametrize("stream", [False, True])
async def test_another_key_cannot_continue_a_response(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    sim: Simulator,
    store: str,
    stream: bool,
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream, store)
    first = await create(proxy, ALICE, stream, input="my secret: the vault code is plum-vault")
    heard = sim.request_count
    error = await refused(proxy, BOB, stream, input="what was said?", previous_response_id=first.id)
    assert sim.request_count == heard  # the upstream heard nothing of it
    # The provider's own answer for an id it does not have, to the letter.
    sim_sdk = openai.AsyncOpenAI(
        base_url=str(upstream.make_url("/v1")), api_key=UPSTREAM_KEY, max_retries=0
    )
    OPENED.append(sim_sdk)
    with pytest.raises(openai.APIStatusError) as unknown:
        await sim_sdk.responses.create(model="gpt", input="x", previous_response_id=first.id + "x")
    status, expected = provider_answer(unknown.value)
    expected["message"] = expected["message"].replace(first.id + "x", first.id)
    assert provider_answer(error) == (status, expected)
    assert "plum-vault" not in str(error.body)
    heard = sim.request_count  # the question just asked of the twin itself
    # One never seen anywhere is refused alike: the refusal tells nothing of what exists.
    never = await refused(proxy, BOB, stream, input="hi", previous_response_id="resp_never")
    assert never.status_code == error.status_code
    assert shown(never, "resp_never") == shown(error, first.id)
    assert sim.request_count == heard
    # Alice (and Carol, of her team, with session_scope: team) go on as before.
    second = await create(proxy, ALICE, stream, input="and then?", previous_response_id=first.id)
    assert sim.requests[-1].body["previous_response_id"] == first.id
    third = await create(proxy, CAROL, stream, input="more", previous_response_id=second.id)
    assert third.id != second.id and sim.requests[-1].status == 200
    # Bob cannot continue Alice's continuation either.
    await refused(proxy, BOB, stream, input="x", previous_response_id=third.id)
    assert sim.request_count == heard + 2


async def test_a_response_not_stored_is_not_recorded(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, sim: Simulator
) -> None:
    """`store: false` (Codex's every turn): the provider keeps nothing to continue, so the
    proxy writes no record either, and answers a continuation as the provider would."""
    proxy = await start(start_proxy, tmp_path, upstream, f"store: {{path: {tmp_path}}}")
    first = await create(proxy, ALICE, False, input="hi", store=False)
    heard = sim.request_count
    error = await refused(proxy, ALICE, False, input="x", previous_response_id=first.id)
    assert error.status_code == 400 and sim.request_count == heard
    assert isinstance(error.body, dict) and error.body["code"] == "previous_response_not_found"


async def test_the_record_survives_a_restart(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, sim: Simulator, store: str
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream, store)
    first = await create(proxy, ALICE, False, input="remember me")
    await proxy.close()
    again = await start(start_proxy, tmp_path, upstream, store)
    await refused(again, BOB, False, input="x", previous_response_id=first.id)
    second = await create(again, ALICE, False, input="still there?", previous_response_id=first.id)
    assert second.output_text and sim.requests[-1].body["previous_response_id"] == first.id


@pytest.mark.parametrize("stream", [False, True])
async def test_a_conversation_id_is_refused_without_calling_upstream(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    sim: Simulator,
    stream: bool,
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream, f"store: {{path: {tmp_path}}}")
    for conversation in ("conv_of_alice", {"id": "conv_of_alice"}):
        error = await refused(proxy, BOB, stream, input="hi", conversation=conversation)
        assert error.status_code == 404 and isinstance(error.body, dict)
        assert error.body["message"] == "Conversation with id 'conv_of_alice' not found."
        assert error.body["param"] == "conversation"
        assert error.body["type"] == "invalid_request_error"
    assert sim.request_count == 0


async def test_stored_response_routes_answer_404_alike_for_every_id(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, sim: Simulator
) -> None:
    proxy = await start(start_proxy, tmp_path, upstream, f"store: {{path: {tmp_path}}}")
    first = await create(proxy, ALICE, False, input="hello")
    heard = sim.request_count
    answers = []
    for response_id in (first.id, "resp_never"):
        for key in (ALICE, BOB):
            sdk = client(proxy, key)
            calls = (
                sdk.responses.retrieve(response_id),
                sdk.responses.delete(response_id),
                sdk.responses.input_items.list(response_id),
                sdk.responses.cancel(response_id),
            )
            for call in calls:
                with pytest.raises(openai.NotFoundError) as caught:
                    await call
                body = caught.value.body
                assert isinstance(body, dict) and body["type"] == "invalid_request_error"
                answers.append(body["message"].replace(response_id, "<id>"))
    assert len(set(answers)) == 1 and "POST /v1/responses" in answers[0]
    assert sim.request_count == heard
    with pytest.raises(openai.AuthenticationError):  # no key, no answer at all
        await client(proxy, "sk-wrong").responses.retrieve(first.id)


async def test_without_keys_previous_response_id_passes_through(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, sim: Simulator
) -> None:
    """One loopback user owns everything: ids made at the provider directly go on too."""
    proxy = await start(start_proxy, tmp_path, upstream, f"store: {{path: {tmp_path}}}", None)
    first = await create(proxy, "unused", False, input="hi")
    second = await create(proxy, "unused", True, input="again", previous_response_id=first.id)
    assert second.output_text and sim.requests[-1].body["previous_response_id"] == first.id
    error = await refused(proxy, "unused", False, input="x", previous_response_id="resp_never")
    assert error.status_code == 400 and sim.requests[-1].status == 400  # the provider's answer


async def test_an_unreadable_store_refuses_continuations(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    sim: Simulator,
    own_redis: OwnRedis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Fail closed: an id that cannot be checked could be anyone's. New responses go on."""
    port, processes = own_redis
    start_redis(port, processes)
    store = f'store: {{backend: redis, url: "redis://127.0.0.1:{port}/0", timeout_s: 0.2}}'
    proxy = await start(start_proxy, tmp_path, upstream, store)
    for _ in range(50):  # until Redis answers
        try:
            first = await create(proxy, ALICE, False, input="hello")
            break
        except openai.APIStatusError:
            await asyncio.sleep(0.1)
    processes[0].terminate()
    processes[0].wait(5)
    heard = sim.request_count
    error = await refused(proxy, ALICE, False, input="x", previous_response_id=first.id)
    assert error.status_code == 503 and isinstance(error.body, dict)
    assert error.body["code"] == "store_unavailable" and first.id not in str(error.body)
    assert sim.request_count == heard
    for stream in (True, False, False):
        fresh = await create(proxy, ALICE, stream, input="a new conversation", store=False)
        assert fresh.output_text  # nothing to record: answered


async def test_an_id_whose_owner_cannot_be_recorded_is_not_handed_out(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    own_redis: OwnRedis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis down (restarting): an answer whose id could not be continued is not given, 503
    `store_unavailable` (a stream, which carried the id in `response.created` already, ends
    with that error instead of `response.completed`). Once Redis is back, ids are recorded
    and continue."""
    port, processes = own_redis
    start_redis(port, processes)
    store = f'store: {{backend: redis, url: "redis://127.0.0.1:{port}/0", timeout_s: 0.2}}'
    proxy = await start(start_proxy, tmp_path, upstream, store)
    await until_answered(proxy)
    processes[0].terminate()
    processes[0].wait(5)
    error = await refused(proxy, ALICE, False, input="while Redis restarts")
    assert error.status_code == 503 and isinstance(error.body, dict)
    assert (error.body["type"], error.body["code"]) == ("service_unavailable", "store_unavailable")
    assert "resp_" not in str(error.body)
    events = await stream_events(proxy, ALICE, input="while Redis restarts")
    names = [event["type"] for event in events]
    assert names[0] == "response.created" and "response.completed" not in names
    assert events[-1]["type"] == "error" and events[-1]["code"] == "store_unavailable"
    lost = [r for r in caplog.records if "could not record the owner" in r.getMessage()]
    assert len(lost) == 1  # an outage fails every write: said once, then summed up
    start_redis(port, processes)  # back, empty
    first = await until_answered(proxy)
    for stream in (False, True):
        later = await create(proxy, ALICE, stream, input="on", previous_response_id=first.id)
        assert later.output_text


async def until_answered(proxy: TestServer) -> Any:
    """A response of ALICE's, once the store takes its record (Redis starting)."""
    for _ in range(50):
        try:
            return await create(proxy, ALICE, False, input="hello")
        except openai.APIStatusError:
            await asyncio.sleep(0.1)
    pytest.fail("Redis did not come up")


async def stream_events(proxy: TestServer, key: str, **body: Any) -> list[dict[str, Any]]:
    """A streamed response's events as the wire carried them (`type` and `code` for `error`)."""
    events = []
    async with aiohttp.ClientSession() as http:
        async with http.post(
            proxy.make_url("/v1/responses"),
            json={"model": "gpt", "stream": True, **body},
            headers={"Authorization": f"Bearer {key}"},
        ) as answer:
            assert answer.status == 200
            async for line in answer.content:
                if line.startswith(b"data: "):
                    data = json.loads(line[6:])
                    kind = data.get("type") or "error"
                    error = data.get("error") if isinstance(data.get("error"), dict) else data
                    events.append({"type": kind, "code": error.get("code")})
    return events


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stored_item_named_by_id_goes_only_to_its_owner(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    sim: Simulator,
    stream: bool,
) -> None:
    """`item_reference` pulls a stored item into the input: an item of a response the caller's
    own owner made goes on; anyone else's, or one never seen, is the provider's unknown item."""
    proxy = await start(start_proxy, tmp_path, upstream, f"store: {{path: {tmp_path}}}")
    first = await create(proxy, ALICE, False, input="my secret: plum-vault")
    [said] = [item.id for item in first.output if item.type == "message"]
    heard = sim.request_count
    for item_id in (said, "msg_never_made"):
        ask = [
            {"role": "user", "content": "repeat this:"},
            {"type": "item_reference", "id": item_id},
        ]
        error = await refused(proxy, BOB, stream, input=ask)
        assert error.status_code == 404 and isinstance(error.body, dict)
        assert error.body["message"] == f"Item with id '{item_id}' not found."
        assert error.body["param"] == "input"
    # Without its type (OpenAI reads it as a reference) it is not a valid message here.
    ask = [{"role": "user", "content": "repeat this:"}, {"id": said}]
    assert (await refused(proxy, BOB, stream, input=ask)).status_code == 400
    assert sim.request_count == heard
    # Its owner (and the owner's team) may name it.
    for key in (ALICE, CAROL):
        ask = [{"role": "user", "content": "repeat this:"}, {"type": "item_reference", "id": said}]
        await create(proxy, key, stream, input=ask)
        assert sim.requests[-1].body["input"][-1] == {"type": "item_reference", "id": said}
    heard = sim.request_count
    # The next turn of the same session (its earlier view lent) is checked as well.
    ask = [{"role": "user", "content": "hi"}]
    headers = {"session-id": "s1"}
    await create(proxy, BOB, stream, input=ask, extra_headers=headers)
    ask += [{"role": "assistant", "content": "hello"}, {"type": "item_reference", "id": said}]
    error = await refused(proxy, BOB, stream, input=ask, extra_headers=headers)
    assert error.status_code == 404 and sim.request_count == heard + 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_reasoning_item_sent_back_by_id_goes_only_to_its_owner(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    sim: Simulator,
    stream: bool,
) -> None:
    """openai-agents sends a stored response's reasoning items back by id (no encrypted
    content): the provider looks them up, so only the owner's own go."""
    proxy = await start(start_proxy, tmp_path, upstream, f"store: {{path: {tmp_path}}}")
    first = await create(proxy, ALICE, stream, input="think", reasoning={"effort": "low"})
    [thought] = [item.id for item in first.output if item.type == "reasoning"]
    echo = {"type": "reasoning", "id": thought, "summary": []}
    ask = [{"role": "user", "content": "think"}, echo, {"role": "user", "content": "more"}]
    heard = sim.request_count
    error = await refused(proxy, BOB, stream, input=ask)
    assert error.status_code == 400 and isinstance(error.body, dict)
    assert error.body["code"] == "stored_object_refused" and error.body["param"] == "input[1]"
    assert sim.request_count == heard
    await create(proxy, ALICE, stream, input=ask)
    assert sim.requests[-1].body["input"][1]["id"] == thought


async def test_another_replica_finds_the_record_at_once(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    sim: Simulator,
    redis_prefix: str,
) -> None:
    """Replicas behind one balancer: the turn after an answer may land on any of them."""
    store = f"store: {{backend: redis, url: {REDIS_URL}, prefix: '{redis_prefix}'}}"
    one = await start(start_proxy, tmp_path, upstream, store)
    two = await start(start_proxy, tmp_path, upstream, store)
    for stream in (False, True):
        first = await create(one, ALICE, stream, input="hello")
        second = await create(two, ALICE, stream, input="again", previous_response_id=first.id)
        assert sim.requests[-1].body["previous_response_id"] == first.id
        await refused(two, BOB, stream, input="x", previous_response_id=second.id)
        await refused(one, BOB, stream, input="x", previous_response_id=second.id)
