"""Tenants share the operator's provider account, so a file, vector store, container or
stored reasoning item named by id is readable by whoever knows the id. With keys configured
the proxy refuses such a request with a 400 naming the field, and the upstream hears nothing;
inline content goes on; without keys everything passes through. Real sockets, simulator
upstream (which counts every model request it receives)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory

ALICE, BOB = "sk-alice-0001", "sk-bob-0002"
UPSTREAM_KEY = "sk-sim-upstream-secret"
KEYS = f"""\
    keys:
      api_keys:
        - {{name: alice, key: {ALICE}}}
        - {{name: bob, key: {BOB}}}
    """


@pytest.fixture
def sim() -> Simulator:
    return Simulator(api_key=UPSTREAM_KEY)


async def start(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator, keys: bool
) -> TestServer:
    upstream = await aiohttp_server(sim.app())
    url = str(upstream.make_url("")).rstrip("/")
    text = f"""\
        store: {{path: {tmp_path / "state"}}}
        model_list:
          - model_name: gpt
            litellm_params:
              model: openai/gpt-sim
              api_base: {url}/v1
              api_key: {UPSTREAM_KEY}
          - model_name: claude
            litellm_params:
              model: anthropic/claude-sim
              api_base: {url}
              api_key: {UPSTREAM_KEY}
        """
    path = tmp_path / "objects.yaml"
    path.write_text(textwrap.dedent(text) + (textwrap.dedent(KEYS) if keys else ""))
    return await start_proxy(path)


async def post(
    proxy: TestServer, path: str, body: dict[str, Any] | bytes, more: dict[str, str] | None = None
) -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = {
        **(more or {}),
        "authorization": f"Bearer {BOB}",
        "x-api-key": BOB,
        "content-type": "application/json",
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.make_url(path), data=raw, headers=headers) as answer:
            return answer.status, await answer.json(content_type=None)


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


COMPUTER_CALL = {
    "type": "computer_call",
    "id": "cu_1",
    "call_id": "cc1",
    "action": {"type": "screenshot"},
    "pending_safety_checks": [],
    "status": "completed",
}
RESPONSES_ATTACKS: list[tuple[dict[str, Any], str]] = [
    ({"tools": [{"type": "code_interpreter", "container": "cntr_alice"}]}, "tools[0].container"),
    (
        {"tools": [{"type": "code_interpreter", "container": {"type": "auto", "file_ids": ["f"]}}]},
        "tools[0].container.file_ids",
    ),
    (
        {"tools": [{"type": "file_search", "vector_store_ids": ["vs_a"]}]},
        "tools[0].vector_store_ids",
    ),
    (
        {"input": [user([{"type": "input_file", "file_id": "file-alice"}])]},
        "input[0].content[0].file_id",
    ),
    (
        {
            "input": [
                user(
                    [
                        {"type": "input_text", "text": "see"},
                        {"type": "input_image", "file_id": "file-a"},
                    ]
                )
            ]
        },
        "input[0].content[1].file_id",
    ),
    (
        {
            "input": [
                user("hi"),
                {
                    "type": "function_call_output",
                    "call_id": "c",
                    "output": [{"type": "input_file", "file_id": "f"}],
                },
            ]
        },
        "input[1].output[0].file_id",
    ),
    ({"input": [user("hi"), {"type": "reasoning", "id": "rs_alice", "summary": []}]}, "input[1]"),
    ({"prompt": {"id": "pmpt_alice", "version": "2"}}, "prompt.id"),
    (
        {"prompt": {"id": "pmpt_a", "variables": {"doc": {"type": "input_file", "file_id": "f"}}}},
        "prompt.variables.doc.file_id",
    ),
    (
        {"tools": [{"type": "image_generation", "input_image_mask": {"file_id": "file-a"}}]},
        "tools[0].input_image_mask.file_id",
    ),
    (
        {
            "input": [
                user("click"),
                COMPUTER_CALL,
                {
                    "type": "computer_call_output",
                    "call_id": "cc1",
                    "output": {"type": "computer_screenshot", "file_id": "file-alice"},
                },
            ]
        },
        "input[2].output.file_id",
    ),
]


@pytest.mark.parametrize(("extra", "field"), RESPONSES_ATTACKS)
async def test_responses_objects_named_by_id_are_refused(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim: Simulator,
    extra: dict[str, Any],
    field: str,
) -> None:
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, keys=True)
    raw = orjson.dumps({"model": "gpt", "input": "hi", **extra})
    for spelled in (raw, escaped(raw)):
        status, answer = await post(proxy, "/v1/responses", spelled)
        assert status == 400, answer
        assert answer["error"]["param"] == field
        assert answer["error"]["code"] == "stored_object_refused"
        assert field in answer["error"]["message"]
    assert sim.request_count == 0


def escaped(raw: bytes) -> bytes:
    """The same request with every key the check looks for spelled in JSON escapes."""
    keys = (b"file_id", b"container", b"vector_store_ids", b"reasoning", b"file", b"prompt")
    for key in (*keys, b"variables", b"input_image_mask", b"skills", b"audio"):
        spelled = b"".join(b"\\u%04x" % c for c in key)
        raw = raw.replace(b'"' + key + b'"', b'"' + spelled + b'"')
    return raw


async def test_responses_inline_content_goes_on(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator
) -> None:
    """Codex's every turn: its reasoning comes back with its encrypted_content, stateless."""
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, keys=True)
    asked = {
        "model": "gpt",
        "store": False,
        "reasoning": {"effort": "low"},
        "include": ["reasoning.encrypted_content"],
        "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}],
    }
    status, first = await post(proxy, "/v1/responses", {**asked, "input": [user("hi")]})
    assert status == 200, first
    said = first["output"]
    assert any(item["type"] == "reasoning" and item["encrypted_content"] for item in said)
    turn = [user("hi"), *said, user("go on")]
    status, answer = await post(proxy, "/v1/responses", {**asked, "input": turn})
    assert sim.request_count == 2 and status == 200, answer
    # A computer-use agent's screenshot, sent inline as OpenAI documents it (an object).
    screenshot = {"type": "computer_screenshot", "image_url": "data:image/png;base64,iVBORw0="}
    output = {"type": "computer_call_output", "call_id": "cc1", "output": screenshot}
    turn = [user("click"), COMPUTER_CALL, output]
    status, answer = await post(proxy, "/v1/responses", {"model": "gpt", "input": turn})
    assert sim.request_count == 3 and status == 200, answer


MESSAGES_ATTACKS: list[tuple[dict[str, Any], str]] = [
    ({"container": "container_alice"}, "container"),
    ({"container": {"id": "container_alice"}}, "container"),
    (
        {
            "messages": [
                user([{"type": "document", "source": {"type": "file", "file_id": "file_a"}}])
            ]
        },
        "messages[0].content[0].source.file_id",
    ),
    (
        {
            "messages": [
                user("hi"),
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                user(
                    [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [
                                {"type": "image", "source": {"type": "file", "file_id": "file_a"}}
                            ],
                        }
                    ]
                ),
            ]
        },
        "messages[2].content[0].content[0].source.file_id",
    ),
    (
        {"messages": [user([{"type": "container_upload", "file_id": "file_alice"}])]},
        "messages[0].content[0].file_id",
    ),
    (
        {"container": {"skills": [{"type": "custom", "skill_id": "skill_alice"}]}},
        "container.skills[0]",
    ),
]


@pytest.mark.parametrize(("extra", "field"), MESSAGES_ATTACKS)
async def test_messages_objects_named_by_id_are_refused(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim: Simulator,
    extra: dict[str, Any],
    field: str,
) -> None:
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, keys=True)
    raw = orjson.dumps({"model": "claude", "max_tokens": 16, "messages": [user("hi")], **extra})
    for spelled in (raw, escaped(raw)):
        status, answer = await post(proxy, "/v1/messages", spelled)
        assert status == 400, answer
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
        assert field in answer["error"]["message"]
    assert sim.request_count == 0


async def test_messages_built_in_skills_go_on(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator
) -> None:
    """Anthropic's own skills (pptx, xlsx...) are no tenant's: only custom ones are refused."""
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, keys=True)
    skills = [{"type": "anthropic", "skill_id": "pptx", "version": "latest"}]
    body = {"model": "claude", "max_tokens": 16, "messages": [user("hi")]}
    status, answer = await post(proxy, "/v1/messages", {**body, "container": {"skills": skills}})
    assert sim.request_count == 1 and status == 200, answer


CHAT_ATTACKS = [
    (
        [user([{"type": "text", "text": "read"}, {"type": "file", "file": {"file_id": "f"}}])],
        "messages[0].content[1].file.file_id",
    ),
    (
        [
            user("hi"),
            {"role": "assistant", "content": "ok"},
            user([{"type": "file", "file": {"file_id": "f", "filename": "a.pdf"}}]),
        ],
        "messages[2].content[0].file.file_id",
    ),
    (
        [user("hi"), {"role": "assistant", "audio": {"id": "audio_alice"}}, user("again")],
        "messages[1].audio.id",
    ),
]


@pytest.mark.parametrize(("messages", "field"), CHAT_ATTACKS)
async def test_chat_files_named_by_id_are_refused(
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim: Simulator,
    messages: list[dict[str, Any]],
    field: str,
) -> None:
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, keys=True)
    raw = orjson.dumps({"model": "gpt", "messages": messages})
    underscore = raw.replace(b'"file_id"', b'"file\\u005Fid"')  # one character escaped
    audio = raw.replace(b'"audio"', b'"a\\u0075dio"')
    for spelled in (raw, escaped(raw), underscore, audio):
        status, answer = await post(proxy, "/v1/chat/completions", spelled)
        assert status == 400, answer
        assert answer["error"]["param"] == field
        assert answer["error"]["code"] == "stored_object_refused"
    # Inline file data goes on.
    inline = {
        "type": "file",
        "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"},
    }
    status, answer = await post(
        proxy, "/v1/chat/completions", {"model": "gpt", "messages": [user([inline])]}
    )
    assert sim.request_count == 1, answer


async def test_without_keys_everything_passes_through(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator
) -> None:
    """One loopback user owns the account: its files are its own."""
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, keys=False)
    for extra, _ in RESPONSES_ATTACKS:
        await post(proxy, "/v1/responses", {"model": "gpt", "input": "hi", **extra})
    for extra, _ in MESSAGES_ATTACKS:
        body = {"model": "claude", "max_tokens": 16, "messages": [user("hi")], **extra}
        await post(proxy, "/v1/messages", body)
    for messages, _ in CHAT_ATTACKS:
        await post(proxy, "/v1/chat/completions", {"model": "gpt", "messages": messages})
    assert sim.request_count == len(RESPONSES_ATTACKS) + len(MESSAGES_ATTACKS) + len(CHAT_ATTACKS)


async def test_a_later_turn_of_a_session_is_checked_too(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, sim: Simulator
) -> None:
    """Only the items new on a turn are walked (the session's earlier view lends the rest):
    a file named on the next turn is still refused, and a refused turn lends nothing."""
    proxy = await start(aiohttp_server, start_proxy, tmp_path, sim, keys=True)
    session = {"x-agentproxy-session": "s1"}
    turn = [user("hi")]
    status, first = await post(proxy, "/v1/responses", {"model": "gpt", "input": turn}, session)
    assert status == 200, first
    turn += [*first["output"], user([{"type": "input_file", "file_id": "file-alice"}])]
    for _ in range(2):  # the refused turn left no view behind to lend its file
        status, answer = await post(
            proxy, "/v1/responses", {"model": "gpt", "input": turn}, session
        )
        assert status == 400 and answer["error"]["param"].endswith(".content[0].file_id")
    messages: list[dict[str, Any]] = [user("hi")]
    body = {"model": "claude", "max_tokens": 16, "messages": messages}
    status, reply = await post(proxy, "/v1/messages", body, session)
    assert status == 200, reply
    file = {"type": "image", "source": {"type": "file", "file_id": "file_a"}}
    messages += [{"role": "assistant", "content": reply["content"]}, user([file])]
    for _ in range(2):
        status, answer = await post(proxy, "/v1/messages", body, session)
        assert (
            status == 400 and "messages[2].content[0].source.file_id" in answer["error"]["message"]
        )
    assert sim.request_count == 2
