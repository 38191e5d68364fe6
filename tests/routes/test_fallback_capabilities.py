"""A fallback re-fits capabilities (proxy/pipeline/capabilities.py), through the real proxy over
real sockets: the alias asked for always answers 503; its fallback's upstream answers 400 when
the request holds what its model_info says it lacks (images, documents, reasoning, tools, a
larger output limit) and 200 otherwise. Each client (openai SDK for chat and Responses,
anthropic SDK for Messages) gets the fallback's 200, the removed part is in the archive under
the ref its marker or event names, and the adaptation is noted and counted."""

from __future__ import annotations

import base64
import re
import textwrap
from collections.abc import Set
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Fault, Simulator
from proxy.state import EVENTS
from tests.conftest import ProxyFactory

IMAGE = "data:image/png;base64," + base64.b64encode(b"\x89PNG fake pixels").decode()
PDF = base64.b64encode(b"%PDF-1.4 fake document").decode()
REF = re.compile(r"ap_[0-9A-Za-z_-]+")
IMAGE_TYPES = {"image_url", "image", "input_image"}
DOCUMENT_TYPES = {"file", "document", "input_file"}
REASONING_TYPES = {"thinking", "redacted_thinking", "reasoning"}
TOOL_TYPES = {"tool_use", "tool_result", "function_call", "function_call_output"}


def _walk(value: Any) -> Any:
    if isinstance(value, dict):
        yield value
        for inner in value.values():
            yield from _walk(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _walk(inner)


def refused(body: dict[str, Any], lacks: Set[str], max_output: int | None) -> str | None:
    """Why a model lacking `lacks` would refuse `body`, or None."""
    types = {d.get("type") for d in _walk(body)}
    if "images" in lacks and types & IMAGE_TYPES:
        return "this model does not take images"
    if "documents" in lacks and types & DOCUMENT_TYPES:
        return "this model does not take documents"
    if "reasoning" in lacks and (
        types & REASONING_TYPES
        or {"thinking", "reasoning", "reasoning_effort"} & body.keys()
        or any("reasoning_content" in d for d in _walk(body.get("messages")))
    ):
        return "this model does not reason"
    if "tools" in lacks and (
        "tools" in body
        or types & TOOL_TYPES
        or any(d.get("role") == "tool" or "tool_calls" in d for d in _walk(body.get("messages")))
    ):
        return "this model does not take tools"
    if max_output is not None:
        for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            if isinstance(body.get(name), int) and body[name] > max_output:
                return f"{name} is above this model's {max_output}"
    return None


class Upstream:
    """Serves chat, Messages and Responses: 503 always (`down`), or 400 for what it lacks."""

    def __init__(
        self, lacks: Set[str] = frozenset(), max_output: int | None = None, down: bool = False
    ) -> None:
        self.lacks, self.max_output, self.down = set(lacks), max_output, down
        self.bodies: list[dict[str, Any]] = []
        self.raw: list[bytes] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._answer(_chat_reply))
        app.router.add_post("/v1/messages", self._answer(_messages_reply))
        app.router.add_post("/v1/responses", self._answer(_responses_reply))
        return app

    def _answer(self, reply: Any) -> Any:
        async def handle(request: web.Request) -> web.Response:
            raw = await request.read()
            body = orjson.loads(raw)
            self.raw.append(raw)
            self.bodies.append(body)
            if self.down:
                return web.json_response({"error": {"message": "overloaded"}}, status=503)
            why = refused(body, self.lacks, self.max_output)
            if why is not None:
                error = {"type": "invalid_request_error", "message": why}
                return web.json_response({"type": "error", "error": error}, status=400)
            return web.json_response(reply(body.get("model")))

        return handle


def _chat_reply(model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }


def _messages_reply(model: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }


def _responses_reply(model: str) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": model,
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 5,
            "output_tokens": 1,
            "total_tokens": 6,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


class Served:
    def __init__(
        self, proxy: TestServer, primary: Upstream, backup: Upstream, state: Path, last: Upstream
    ) -> None:
        self.proxy, self.primary, self.backup, self.state = proxy, primary, backup, state
        self.last = last
        self.url = str(proxy.make_url("")).rstrip("/")
        self.clients: list[Any] = []

    def openai(self) -> openai.AsyncOpenAI:
        sdk = openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="sk-x", max_retries=0)
        self.clients.append(sdk)
        return sdk

    def anthropic(self) -> anthropic.AsyncAnthropic:
        sdk = anthropic.AsyncAnthropic(base_url=self.url, api_key="sk-x", max_retries=0)
        self.clients.append(sdk)
        return sdk

    async def archived(self, ref: str) -> str:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{self.url}/v1/agentproxy/archive/{ref}") as response:
                assert response.status == 200, await response.text()
                return str((await response.json())["content"])

    async def metric(self, action: str) -> float:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{self.url}/metrics") as response:
                text = await response.text()
        wanted = f'agentproxy_rewrites_total{{action="{action}",stage="capabilities"}} '
        for line in text.splitlines():
            if line.startswith(wanted):
                return float(line.split()[-1])
        return 0.0


@pytest.fixture
async def serve(aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path) -> Any:
    async def start(
        provider: str,
        info: str,
        *,
        lacks: Set[str] = frozenset(),
        max_output: int | None = None,
        backup_down: bool = False,
    ) -> Served:
        """primary (503) falls back to backup (model_info `info`); with `backup_down`, backup
        answers 503 too and the chain goes on to `last`, which takes everything."""
        primary, backup = Upstream(down=True), Upstream(lacks, max_output, down=backup_down)
        last = Upstream()
        bases = []
        for upstream in (primary, backup, last):
            server = await aiohttp_server(upstream.app())
            base = str(server.make_url("")).rstrip("/")
            bases.append(base if provider == "anthropic" else base + "/v1")
        text = f"""\
            store: {{path: {tmp_path / "state"}}}
            model_list:
              - model_name: primary
                litellm_params: {{model: {provider}/primary, api_base: {bases[0]}, api_key: k}}
              - model_name: backup
                litellm_params: {{model: {provider}/backup, api_base: {bases[1]}, api_key: k}}
                model_info: {{{info}}}
              - model_name: last
                litellm_params: {{model: {provider}/last, api_base: {bases[2]}, api_key: k}}
            policies:
              - name: resilient
                retry: {{attempts: 1}}
                fallbacks: [{{from: primary, to: [backup, last]}}]
            """
        path = tmp_path / "c.yaml"
        path.write_text(textwrap.dedent(text))
        proxy = await start_proxy(path)
        served.append(Served(proxy, primary, backup, tmp_path / "state", last))
        return served[-1]

    served: list[Served] = []
    yield start
    for one in served:
        for sdk in one.clients:
            await sdk.close()


def applied(raw: Any) -> str:
    return str(raw.headers.get("x-agentproxy-applied", ""))


# --- chat completions (openai SDK) ------------------------------------------------------------


async def test_chat_images_are_archived_and_marked_for_a_fallback_without_vision(
    serve: Any,
) -> None:
    served = await serve("openai", "supports_vision: false", lacks={"images"})
    image = {"type": "image_url", "image_url": {"url": IMAGE}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]
    raw = await served.openai().chat.completions.with_raw_response.create(
        model="primary",
        messages=messages,  # type: ignore[arg-type]
    )
    assert raw.http_response.status_code == 200
    assert raw.parse().choices[0].message.content == "ok"
    assert "capabilities.removed_images;count=1" in applied(raw)
    sent = served.backup.bodies[-1]["messages"][0]["content"]
    assert sent[0] == {"type": "text", "text": "what is this?"}
    marker = sent[1]["text"]
    assert marker.startswith("[agentproxy] An image was here") and "backup" in marker
    ref = REF.search(marker).group(0)  # type: ignore[union-attr]
    assert orjson.loads(await served.archived(ref)) == image
    assert await served.metric("removed_images") == 1


async def test_chat_documents_are_archived_for_a_fallback_without_pdf_input(serve: Any) -> None:
    served = await serve("openai", "supports_pdf_input: false", lacks={"documents"})
    document = {
        "type": "file",
        "file": {"filename": "a.pdf", "file_data": f"data:application/pdf;base64,{PDF}"},
    }
    messages = [{"role": "user", "content": [{"type": "text", "text": "summarize"}, document]}]
    raw = await served.openai().chat.completions.with_raw_response.create(
        model="primary",
        messages=messages,  # type: ignore[arg-type]
    )
    assert raw.http_response.status_code == 200
    assert "capabilities.removed_documents;count=1" in applied(raw)
    marker = served.backup.bodies[-1]["messages"][0]["content"][1]["text"]
    ref = REF.search(marker).group(0)  # type: ignore[union-attr]
    assert orjson.loads(await served.archived(ref)) == document
    assert await served.metric("removed_documents") == 1


TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}
CHAT_TOOL_HISTORY = [
    {"role": "user", "content": "read notes.txt"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "notes.txt"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "buy milk"},
    {"role": "user", "content": "and now?"},
]


async def test_chat_tools_become_text_for_a_fallback_without_function_calling(
    serve: Any,
) -> None:
    served = await serve("openai", "supports_function_calling: false", lacks={"tools"})
    raw = await served.openai().chat.completions.with_raw_response.create(
        model="primary",
        messages=CHAT_TOOL_HISTORY,  # type: ignore[arg-type]
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice="auto",
    )
    assert raw.http_response.status_code == 200
    assert "capabilities.removed_tools;count=2" in applied(raw)
    sent = served.backup.bodies[-1]
    assert "tools" not in sent and "tool_choice" not in sent
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user", "user"]
    assert 'read_file (call call_1) with {"path": "notes.txt"}' in sent["messages"][1]["content"]
    assert sent["messages"][2]["content"].endswith("buy milk")
    events = [e for e in _events(served) if e.get("action") == "removed_tools"]
    assert orjson.loads(await served.archived(events[0]["ref"])) == [TOOL]
    assert await served.metric("removed_tools") == 1


async def test_chat_max_tokens_is_clamped_to_the_fallbacks_output_limit(serve: Any) -> None:
    served = await serve("openai", "max_output_tokens: 4096", max_output=4096)
    raw = await served.openai().chat.completions.with_raw_response.create(
        model="primary", messages=[{"role": "user", "content": "hi"}], max_tokens=32_000
    )
    assert raw.http_response.status_code == 200
    assert "capabilities.clamped_max_tokens" in applied(raw)
    event = next(e for e in _events(served) if e.get("action") == "clamped_max_tokens")
    assert (event["asked"], event["to"], event["model"]) == (32_000, 4096, "backup")
    assert served.backup.bodies[-1]["max_tokens"] == 4096
    assert served.primary.bodies[-1]["max_tokens"] == 32_000  # the alias asked for got it all
    assert await served.metric("clamped_max_tokens") == 1


async def test_chat_reasoning_is_archived_for_a_fallback_that_does_not_reason(
    serve: Any,
) -> None:
    served = await serve("openai", "supports_reasoning: false", lacks={"reasoning"})
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "two and two make four"},
        {"role": "user", "content": "and 3+3?"},
    ]
    raw = await served.openai().chat.completions.with_raw_response.create(
        model="primary",
        messages=messages,  # type: ignore[arg-type]
        reasoning_effort="high",
    )
    assert raw.http_response.status_code == 200
    assert "capabilities.removed_reasoning;count=1" in applied(raw)
    sent = served.backup.bodies[-1]
    assert "reasoning_effort" not in sent
    assert sent["messages"][1] == {"role": "assistant", "content": "4"}
    event = next(e for e in _events(served) if e.get("action") == "removed_reasoning")
    kept = orjson.loads(await served.archived(event["refs"][0]))
    assert kept == {"reasoning_content": "two and two make four"}


async def test_a_fallback_that_takes_everything_gets_the_request_unchanged(serve: Any) -> None:
    served = await serve("openai", "supports_vision: true, max_output_tokens: 64000")
    image = {"type": "image_url", "image_url": {"url": IMAGE}}
    messages = [*CHAT_TOOL_HISTORY[:-1], {"role": "user", "content": [image]}]
    raw = await served.openai().chat.completions.with_raw_response.create(
        model="primary",
        messages=messages,  # type: ignore[arg-type]
        tools=[TOOL],  # type: ignore[list-item]
        max_tokens=1000,
    )
    assert raw.http_response.status_code == 200
    assert "capabilities." not in applied(raw)
    first, last = served.primary.bodies[0], served.backup.bodies[-1]
    assert last == {**first, "model": "backup"}
    assert served.backup.raw[-1] == served.primary.raw[0].replace(b'"primary"', b'"backup"')


async def test_the_next_fallback_starts_again_from_the_clients_own_request(serve: Any) -> None:
    info = "supports_function_calling: false, supports_vision: false, max_output_tokens: 100"
    served = await serve("openai", info, backup_down=True)
    image = {"type": "image_url", "image_url": {"url": IMAGE}}
    messages = [*CHAT_TOOL_HISTORY[:-1], {"role": "user", "content": [image]}]
    raw = await served.openai().chat.completions.with_raw_response.create(
        model="primary",
        messages=messages,  # type: ignore[arg-type]
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice="auto",
        max_tokens=1000,
    )
    assert raw.http_response.status_code == 200
    adapted = served.backup.bodies[-1]
    assert "tools" not in adapted and adapted["max_tokens"] == 100  # fitted to backup...
    first, last = served.primary.bodies[0], served.last.bodies[-1]
    assert last == {**first, "model": "last"}  # ...and the next one got the client's own


# --- Anthropic Messages (anthropic SDK) -------------------------------------------------------


async def test_anthropic_thinking_is_left_out_for_a_fallback_that_does_not_reason(
    serve: Any,
) -> None:
    served = await serve("anthropic", "supports_reasoning: false", lacks={"reasoning"})
    thinking = {"type": "thinking", "thinking": "the user wants a file", "signature": "sig=="}
    messages = [
        {"role": "user", "content": "read notes.txt"},
        {
            "role": "assistant",
            "content": [
                thinking,
                {"type": "tool_use", "id": "tu_1", "name": "read_file", "input": {"path": "n"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "buy milk"}],
        },
    ]
    tools = [{"name": "read_file", "input_schema": {"type": "object"}}]
    raw = await served.anthropic().messages.with_raw_response.create(
        model="primary",
        max_tokens=2048,
        messages=messages,  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert raw.http_response.status_code == 200
    assert (await raw.parse()).content[0].text == "ok"  # type: ignore[union-attr]
    assert "capabilities.removed_reasoning;count=1" in raw.headers["x-agentproxy-applied"]
    sent = served.backup.bodies[-1]
    assert "thinking" not in sent
    assert sent["messages"][1]["content"] == [messages[1]["content"][1]]  # the tool_use kept
    assert served.primary.bodies[0]["messages"][1]["content"][0] == thinking
    event = next(e for e in _events(served) if e.get("action") == "removed_reasoning")
    assert orjson.loads(await served.archived(event["refs"][0])) == thinking
    assert await served.metric("removed_reasoning") == 1


async def test_anthropic_thinking_does_not_travel_to_another_provider(serve: Any) -> None:
    served = await serve("anthropic", "max_input_tokens: 100000", lacks={"reasoning"})
    thinking = {"type": "thinking", "thinking": "plan", "signature": "signed-by-primary"}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [thinking, {"type": "text", "text": "hello"}]},
        {"role": "user", "content": "again"},
    ]
    raw = await served.anthropic().messages.with_raw_response.create(
        model="primary",
        max_tokens=4096,
        messages=messages,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert raw.http_response.status_code == 200
    assert "capabilities.removed_reasoning;count=1" in raw.headers["x-agentproxy-applied"]
    sent = served.backup.bodies[-1]
    assert sent["messages"][1]["content"] == [{"type": "text", "text": "hello"}]
    assert "thinking" not in sent  # a turn without its thinking block would be refused


async def test_an_anthropic_fallback_that_takes_everything_gets_the_clients_bytes(
    serve: Any,
) -> None:
    served = await serve("anthropic", "supports_vision: true, max_output_tokens: 64000")
    source = {"type": "base64", "media_type": "image/png", "data": "iVBO"}
    messages = [
        {"role": "user", "content": [{"type": "image", "source": source}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "r", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]},
    ]
    raw = await served.anthropic().messages.with_raw_response.create(
        model="primary",
        max_tokens=1000,
        messages=messages,  # type: ignore[arg-type]
        tools=[{"name": "r", "input_schema": {"type": "object"}}],
    )
    assert raw.http_response.status_code == 200
    assert "capabilities." not in raw.headers["x-agentproxy-applied"]
    assert served.backup.raw[-1] == served.primary.raw[0].replace(b'"primary"', b'"backup"')


async def test_anthropic_images_are_marked_and_max_tokens_clamped(serve: Any) -> None:
    info = "supports_vision: false, max_output_tokens: 4096"
    served = await serve("anthropic", info, lacks={"images"}, max_output=4096)
    source = {"type": "base64", "media_type": "image/png", "data": "iVBO"}
    image = {"type": "image", "source": source}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "what is it?"}]}]
    raw = await served.anthropic().messages.with_raw_response.create(
        model="primary",
        max_tokens=16_000,
        messages=messages,  # type: ignore[arg-type]
    )
    assert raw.http_response.status_code == 200
    notes = raw.headers["x-agentproxy-applied"]
    assert "capabilities.removed_images;count=1" in notes
    assert "capabilities.clamped_max_tokens" in notes
    sent = served.backup.bodies[-1]
    assert sent["max_tokens"] == 4096
    content = sent["messages"][0]["content"]
    assert (content[1]["type"], content[1]["text"]) == ("text", "what is it?")
    assert content[0]["type"] == "text" and content[0]["text"].startswith("[agentproxy]")
    ref = REF.search(content[0]["text"]).group(0)  # type: ignore[union-attr]
    assert orjson.loads(await served.archived(ref)) == image


async def test_anthropic_documents_are_archived_for_a_fallback_without_pdf_input(
    serve: Any,
) -> None:
    served = await serve("anthropic", "supports_pdf_input: false", lacks={"documents"})
    document = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
    }
    messages = [{"role": "user", "content": [document, {"type": "text", "text": "summarize"}]}]
    raw = await served.anthropic().messages.with_raw_response.create(
        model="primary",
        max_tokens=100,
        messages=messages,  # type: ignore[arg-type]
    )
    assert raw.http_response.status_code == 200
    assert "capabilities.removed_documents;count=1" in raw.headers["x-agentproxy-applied"]
    marker = served.backup.bodies[-1]["messages"][0]["content"][0]["text"]
    ref = REF.search(marker).group(0)  # type: ignore[union-attr]
    assert orjson.loads(await served.archived(ref)) == document


async def test_anthropic_tools_become_text_for_a_fallback_without_function_calling(
    serve: Any,
) -> None:
    served = await serve("anthropic", "supports_function_calling: false", lacks={"tools"})
    messages = [
        {"role": "user", "content": "read notes.txt"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "tu_1", "name": "read_file", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "tu_1", "content": "buy milk"},
                {"type": "text", "text": "and now?"},
            ],
        },
    ]
    raw = await served.anthropic().messages.with_raw_response.create(
        model="primary",
        max_tokens=100,
        messages=messages,  # type: ignore[arg-type]
        tools=[{"name": "read_file", "input_schema": {"type": "object"}}],
        tool_choice={"type": "auto"},
    )
    assert raw.http_response.status_code == 200
    assert "capabilities.removed_tools;count=2" in raw.headers["x-agentproxy-applied"]
    sent = served.backup.bodies[-1]
    assert "tools" not in sent and "tool_choice" not in sent
    assert "buy milk" in orjson.dumps(sent["messages"]).decode()


# --- Responses (openai SDK) -------------------------------------------------------------------


async def test_responses_reasoning_items_and_images_for_a_plain_fallback(serve: Any) -> None:
    info = "supports_reasoning: false, supports_vision: false, max_output_tokens: 2048"
    served = await serve("openai", info, lacks={"reasoning", "images"}, max_output=2048)
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}
    items = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": IMAGE},
            ],
        },
        reasoning,
        {"role": "assistant", "content": [{"type": "output_text", "text": "a cat"}]},
        {"role": "user", "content": "sure?"},
    ]
    raw = await served.openai().responses.with_raw_response.create(
        model="primary",
        input=items,  # type: ignore[arg-type]
        reasoning={"effort": "high"},
        include=["reasoning.encrypted_content"],
        max_output_tokens=30_000,
    )
    assert raw.http_response.status_code == 200
    assert raw.parse().output_text == "ok"
    notes = raw.headers["x-agentproxy-applied"]
    for action in ("removed_images;count=1", "removed_reasoning;count=1", "clamped_max_tokens"):
        assert f"capabilities.{action}" in notes
    sent = served.backup.bodies[-1]
    assert "reasoning" not in sent and sent.get("include") == []
    assert sent["max_output_tokens"] == 2048
    assert [i.get("type", "message") for i in sent["input"]] == ["message"] * 3
    marker = sent["input"][0]["content"][1]["text"]
    assert sent["input"][0]["content"][0] == {"type": "input_text", "text": "look"}
    ref = REF.search(marker).group(0)  # type: ignore[union-attr]
    assert orjson.loads(await served.archived(ref)) == items[0]["content"][1]  # type: ignore[index]
    event = next(e for e in _events(served) if e.get("action") == "removed_reasoning")
    assert orjson.loads(await served.archived(event["refs"][0])) == reasoning


async def test_responses_tools_become_text_and_their_reasoning_is_archived(serve: Any) -> None:
    served = await serve("openai", "supports_function_calling: false", lacks={"tools"})
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}
    items = [
        {"role": "user", "content": "read notes.txt"},
        reasoning,
        {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "buy milk"},
        {"role": "user", "content": "and now?"},
    ]
    raw = await served.openai().responses.with_raw_response.create(
        model="primary",
        input=items,  # type: ignore[arg-type]
        tools=[{"type": "function", "name": "read_file", "parameters": {"type": "object"}}],
        tool_choice="auto",
    )
    assert raw.http_response.status_code == 200
    notes = raw.headers["x-agentproxy-applied"]
    assert "capabilities.removed_tools;count=2" in notes
    assert "capabilities.removed_reasoning;count=1" in notes
    sent = served.backup.bodies[-1]
    assert "tools" not in sent and "tool_choice" not in sent
    assert [i.get("role") for i in sent["input"]] == ["user", "assistant", "user", "user"]
    assert "buy milk" in orjson.dumps(sent["input"]).decode()
    event = next(e for e in _events(served) if e.get("action") == "removed_reasoning")
    assert orjson.loads(await served.archived(event["refs"][0])) == reasoning


async def test_responses_documents_are_archived_for_a_fallback_without_pdf_input(
    serve: Any,
) -> None:
    served = await serve("openai", "supports_pdf_input: false", lacks={"documents"})
    data = f"data:application/pdf;base64,{PDF}"
    document = {"type": "input_file", "filename": "a.pdf", "file_data": data}
    items = [{"role": "user", "content": [{"type": "input_text", "text": "summarize"}, document]}]
    raw = await served.openai().responses.with_raw_response.create(
        model="primary",
        input=items,  # type: ignore[arg-type]
    )
    assert raw.http_response.status_code == 200
    assert "capabilities.removed_documents;count=1" in raw.headers["x-agentproxy-applied"]
    marker = served.backup.bodies[-1]["input"][0]["content"][1]["text"]
    ref = REF.search(marker).group(0)  # type: ignore[union-attr]
    assert orjson.loads(await served.archived(ref)) == document


def _events(served: Served) -> list[dict[str, Any]]:
    """The event log's lines (the proxy writes them in its store's folder)."""
    served.proxy.app[EVENTS].flush()
    with (served.state / "events.jsonl").open() as lines:
        return [orjson.loads(line) for line in lines]


async def test_a_streamed_request_is_refitted_the_same_way(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator()
    upstream = await aiohttp_server(sim.app())
    base = str(upstream.make_url("")).rstrip("/") + "/v1"
    config = f"""\
        store: {{path: {tmp_path / "state"}}}
        model_list:
          - model_name: primary
            litellm_params: {{model: openai/primary, api_base: {base}, api_key: k}}
          - model_name: backup
            litellm_params: {{model: openai/backup, api_base: {base}, api_key: k}}
            model_info: {{supports_vision: false}}
        policies:
          - name: resilient
            retry: {{attempts: 1}}
            fallbacks: [{{from: primary, to: [backup]}}]
        """
    (tmp_path / "c.yaml").write_text(textwrap.dedent(config))
    proxy = await start_proxy(tmp_path / "c.yaml")
    sim.inject(Fault(status=503, times=10, model="primary"))
    image = {"type": "image_url", "image_url": {"url": IMAGE}}
    sdk = openai.AsyncOpenAI(
        base_url=str(proxy.make_url("")).rstrip("/") + "/v1", api_key="sk-x", max_retries=0
    )
    try:
        stream = await sdk.chat.completions.create(
            model="primary",
            messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}],
            stream=True,
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    finally:
        await sdk.close()
    assert text  # the simulator answers (it may first use the recall tool it is offered)
    sent = next(r.body for r in sim.requests if r.body["model"] == "backup")
    assert sent["model"] == "backup" and sent["stream"] is True
    assert sent["messages"][0]["content"][1]["text"].startswith("[agentproxy] An image was here")
