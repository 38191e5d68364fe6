"""The OpenAI Responses twin through the `openai` SDK over real sockets: a tool round trip,
pairing errors, encrypted reasoning, the stream's event order, the window and cached tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from proxy.sim import Fault, Simulator, run_simulator
from proxy.sim.responses import CONTEXT_EXCEEDED

JSON = dict[str, Any]
KEY = "sk-sim-responses"
WEATHER: JSON = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ASK = [{"role": "user", "content": "what is the weather? use get_weather"}]


@pytest.fixture
def sim() -> Simulator:
    return Simulator(api_key=KEY, context_window=4096, cache_min_tokens=256)


@pytest.fixture
async def client(sim: Simulator) -> AsyncIterator[openai.AsyncOpenAI]:
    async with (
        run_simulator(sim) as url,
        openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as sdk,
    ):
        yield sdk


async def refused(call: Any, status: type[openai.APIStatusError] = openai.BadRequestError) -> JSON:
    with pytest.raises(status) as caught:
        await call
    body = caught.value.body
    assert isinstance(body, dict)
    return body


def dumped(items: Any) -> list[JSON]:
    return [item.model_dump(exclude_none=True) for item in items]


async def test_a_function_tool_round_trip(client: openai.AsyncOpenAI, sim: Simulator) -> None:
    first = await client.responses.create(model="sim", input=ASK, tools=[WEATHER])
    assert first.id.startswith("resp_") and first.status == "completed"
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and '"city"' in call.arguments
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    second = await client.responses.create(
        model="sim",
        input=[*ASK, *dumped(first.output), output],
        tools=[WEATHER],
    )
    assert second.output_text == "get_weather returned: sunny, 21 C"
    assert second.output[0].type == "message" and second.output[0].role == "assistant"
    assert second.usage is not None and second.usage.input_tokens > first.usage.input_tokens
    assert [r.path for r in sim.requests] == ["/v1/responses"] * 2


async def test_a_call_without_its_output_and_an_output_without_its_call_are_refused(
    client: openai.AsyncOpenAI,
) -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
    body = await refused(client.responses.create(model="sim", input=[*ASK, call], tools=[WEATHER]))
    assert body["message"] == "No tool output found for function call call_1."
    orphan = {"type": "function_call_output", "call_id": "call_9", "output": "x"}
    body = await refused(client.responses.create(model="sim", input=[*ASK, orphan]))
    assert body["message"] == "No tool call found for function call output with call_id call_9."
    custom = {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "x"}
    body = await refused(client.responses.create(model="sim", input=[*ASK, custom]))
    assert body["message"] == "No tool output found for custom tool call call_2."
    # The next request is answered.
    assert (await client.responses.create(model="sim", input="hi")).output_text == "You said: hi"


async def test_a_stored_response_is_continued_by_its_id(client: openai.AsyncOpenAI) -> None:
    """As OpenAI does, for whoever names it: what the proxy must keep tenants from doing."""
    first = await client.responses.create(model="sim", input=ASK, tools=[WEATHER])
    [call] = [item for item in first.output if item.type == "function_call"]
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = await client.responses.create(
        model="sim", input=[answer], tools=[WEATHER], previous_response_id=first.id
    )
    assert "sunny" in second.output_text
    unstored = await client.responses.create(model="sim", input="hi", store=False)
    body = await refused(
        client.responses.create(model="sim", input="hi", previous_response_id=unstored.id)
    )
    assert body["code"] == "previous_response_not_found"


async def test_shapes_the_api_refuses(client: openai.AsyncOpenAI) -> None:
    chat_shaped = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    body = await refused(client.responses.create(model="sim", input="hi", tools=[chat_shaped]))
    assert body["message"] == "Missing required parameter: 'tools[0].name'."
    assert body["code"] == "missing_required_parameter"
    body = await refused(
        client.responses.create(model="sim", input=[{"role": "tool", "content": "x"}])
    )
    assert body["param"] == "input[0].role" and body["code"] == "invalid_value"
    body = await refused(
        client.responses.create(model="sim", input="hi", previous_response_id="resp_gone")
    )
    assert body["message"] == "Previous response with id 'resp_gone' not found."
    body = await refused(client.responses.create(input="hi"))
    assert body["message"] == "Missing required parameter: 'model'."


async def test_encrypted_reasoning_round_trips_and_a_tampered_one_is_refused(
    client: openai.AsyncOpenAI, sim: Simulator
) -> None:
    asked = await client.responses.create(
        model="sim",
        input=ASK,
        tools=[WEATHER],
        store=False,
        include=["reasoning.encrypted_content"],
        reasoning={"effort": "medium", "summary": "auto"},
    )
    reasoning, call = asked.output[0], asked.output[1]
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    assert reasoning.summary and "get_weather" in reasoning.summary[0].text
    assert asked.usage is not None and asked.usage.output_tokens_details.reasoning_tokens > 0
    assert call.type == "function_call"
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "rain"}

    async def answer(items: list[JSON]) -> Any:
        return await client.responses.create(
            model="sim",
            input=[*ASK, *items, output],
            tools=[WEATHER],
            store=False,
            include=["reasoning.encrypted_content"],
        )

    returned = dumped(asked.output)
    assert (await answer(returned)).output_text == "get_weather returned: rain"
    assert (await answer(returned[1:])).output_text.endswith("rain")  # dropping it is allowed
    tampered = [returned[0] | {"encrypted_content": returned[0]["encrypted_content"][:-8]}]
    body = await refused(answer(tampered + returned[1:]))
    assert body["code"] == "invalid_encrypted_content"
    assert body["message"].startswith(f"The encrypted content for item {reasoning.id} could not")
    foreign = Simulator().responses.sealer.seal("reasoning", "")
    body = await refused(answer([returned[0] | {"encrypted_content": foreign}, *returned[1:]]))
    assert body["code"] == "invalid_encrypted_content"
    # A replay's simulator takes what a recorded client sent as sealed here, exactly as sent.
    sim.vouch("/v1/responses", {"input": [returned[0] | {"encrypted_content": foreign}]})
    vouched = await answer([returned[0] | {"encrypted_content": foreign}, *returned[1:]])
    assert vouched.output_text.endswith("rain")
    cut = returned[0] | {"encrypted_content": foreign[:-4]}
    body = await refused(answer([cut, *returned[1:]]))
    assert body["code"] == "invalid_encrypted_content"
    # With store false, a reasoning item without its encrypted content names nothing stored.
    bare = {k: v for k, v in returned[0].items() if k != "encrypted_content"}
    body = await refused(answer([bare, *returned[1:]]), openai.NotFoundError)
    assert "Items are not persisted when `store` is set to false" in body["message"]


async def test_the_stream_sends_the_real_event_sequence(client: openai.AsyncOpenAI) -> None:
    async with client.responses.stream(
        model="sim",
        input="say something long enough",
        reasoning={"summary": "auto"},
    ) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    kinds = [event.type for event in events]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    summary = kinds.index("response.reasoning_summary_text.delta")
    text = kinds.index("response.output_text.delta")
    assert kinds.index("response.reasoning_summary_part.added") < summary < text
    assert kinds.index("response.content_part.added") < text
    assert kinds.index("response.output_text.done") < kinds.index("response.content_part.done")
    assert kinds.count("response.output_item.done") == 2  # reasoning, message
    assert final.output_text == "You said: say something long enough"
    assert final.usage is not None and final.usage.total_tokens > 0

    async with client.responses.stream(model="sim", input=ASK, tools=[WEATHER]) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert kinds.index("response.function_call_arguments.done") < kinds.index(
        "response.output_item.done"
    )
    assert final.output[0].type == "function_call"


async def test_over_the_window_is_context_length_exceeded(
    client: openai.AsyncOpenAI, sim: Simulator
) -> None:
    huge = "word " * 20_000
    body = await refused(client.responses.create(model="sim", input=huge))
    assert body == {
        "message": CONTEXT_EXCEEDED,
        "type": "invalid_request_error",
        "param": "input",
        "code": "context_length_exceeded",
    }
    # Streamed, the API opens the stream and then fails the response.
    async with client.responses.stream(model="sim", input=huge) as stream:
        events = [event async for event in stream]
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.response.error is not None
    assert failed.response.error.code == "context_length_exceeded"
    assert [r.status for r in sim.requests] == [400, 200]


async def test_cached_tokens_grow_over_three_turns_under_one_prompt_cache_key(
    client: openai.AsyncOpenAI,
) -> None:
    instructions = "You are a careful assistant. " * 200  # ~1,500 tokens, over the minimum
    items: list[JSON] = []
    cached = []
    for turn in range(3):
        items.append({"role": "user", "content": f"turn {turn}: " + "detail " * 50})
        reply = await client.responses.create(
            model="sim",
            instructions=instructions,
            input=items,
            prompt_cache_key="thread-1",
        )
        assert reply.usage is not None
        cached.append(reply.usage.input_tokens_details.cached_tokens)
        assert cached[-1] <= reply.usage.input_tokens
        items += dumped(reply.output)
    assert cached[0] == 0
    assert 0 < cached[1] < cached[2]
    assert all(tokens % 128 == 0 for tokens in cached)
    # Another key shares nothing.
    other = await client.responses.create(
        model="sim",
        instructions=instructions,
        input=items,
        prompt_cache_key="thread-2",
    )
    assert other.usage is not None and other.usage.input_tokens_details.cached_tokens == 0


async def test_faults_and_the_request_record_work_on_this_wire(
    client: openai.AsyncOpenAI, sim: Simulator
) -> None:
    sim.inject(Fault(status=429, retry_after=1))
    body = await refused(client.responses.create(model="sim", input="hi"), openai.RateLimitError)
    assert body["code"] == "rate_limit_exceeded"
    reply = await client.responses.create(model="sim", input="hi")
    assert reply.output_text == "You said: hi"
    assert [r.status for r in sim.requests] == [429, 200]
    assert sim.requests[0].api_key == KEY
