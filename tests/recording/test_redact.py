"""What a recording may not keep, checked in the store's own bytes (the SQLite file, its log and
the event log): a `redact` pattern's match in a JSON object's key, a deployment's extra_headers
secret that its upstream echoes, and a client key sent as a session id (or a parent session
id): none is kept, nor shown on the board, as is."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.recording.redact import REDACTED, matcher
from proxy.sessions.identity import scoped
from proxy.state import EVENTS, RECORDINGS, STORE
from tests.conftest import ProxyFactory

ALICE, BOB, ADMIN = "sk-alice-key-0001", "sk-bob-key-00002", "admin-key-000003"
HEADER_SECRET = "hdr-secret-5550912"
KEY_PATTERN = "PRIVATE-[0-9]+"
IN_KEY = "PRIVATE-771"


def config(url: str, data: Path) -> str:
    return textwrap.dedent(
        f"""\
        store: {{path: {data}}}
        keys:
          admin_key: {ADMIN}
          api_keys:
            - {{name: alice, key: {ALICE}}}
            - {{name: bob, key: {BOB}}}
        model_list:
          - model_name: echo
            litellm_params:
              model: openai/echo
              api_base: {url}/v1
              extra_headers: {{x-upstream-token: "Token {HEADER_SECRET}"}}
        policies:
          - name: recorded
            record: {{enabled: true, redact: ['{KEY_PATTERN}']}}
        """
    )


def echo_upstream() -> web.Application:
    """Answers with the deployment's header token in its text and as an object's key (in the
    tool call's arguments), and the request's own object keys back: JSON or a stream."""

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        token = request.headers["x-upstream-token"].split(" ", 1)[1]
        arguments = json.dumps({token: 1, IN_KEY: 2, "keys": list(body.get("metadata", {}))})
        message = {"role": "assistant", "content": f"your token is {token}",
                   "tool_calls": [{"id": "call_1", "type": "function",
                                   "function": {"name": "f", "arguments": arguments}}]}  # fmt: skip
        reply = {"id": "c1", "object": "chat.completion", "created": 1, "model": "echo",
                 "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                 IN_KEY: {token: "object keys too"}}  # fmt: skip
        if not body.get("stream"):
            return web.json_response(reply)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        delta = {**message, "tool_calls": [{"index": 0, **message["tool_calls"][0]}]}
        chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "echo",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": "stop"}]}  # fmt: skip
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    return app


async def post(proxy: TestServer, key: str, headers: dict[str, str], **body: Any) -> None:
    request = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], **body}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            str(proxy.make_url("/v1/chat/completions")),
            json=request,
            headers={"authorization": f"Bearer {key}", **headers},
        ) as response,
    ):
        assert response.status == 200, await response.text()
        await response.read()


def stored_bytes(data: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(data.iterdir()) if path.is_file())


@pytest.mark.parametrize("stream", [False, True])
async def test_keys_header_secrets_and_key_named_sessions_never_reach_the_store(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, stream: bool
) -> None:
    upstream: TestServer = await aiohttp_server(echo_upstream())
    path = tmp_path / "agentproxy.yaml"
    data = tmp_path / "data"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), data))
    proxy = await start_proxy(path)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {f"{IN_KEY}-field": {"type": "string"}}}}}]  # fmt: skip
    await post(proxy, ALICE, {"x-agentproxy-session": "plain"}, tools=tools, stream=stream)
    # A session id that is the client's own key, another tenant's, the admin key; a parent too.
    await post(proxy, ALICE, {"x-agentproxy-session": ALICE}, stream=stream)
    await post(proxy, ALICE, {"x-agentproxy-session": BOB}, stream=stream)
    await post(proxy, ALICE, {"x-agentproxy-session": ADMIN, "x-agentproxy-parent-session": ALICE})
    await post(proxy, ALICE, {"session-id": HEADER_SECRET})
    await proxy.app[RECORDINGS].flush()
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            str(proxy.make_url("/admin/sessions")), headers={"authorization": f"Bearer {ADMIN}"}
        ) as listed,
    ):
        board = await listed.read()
    names = {row["session"] for row in json.loads(board)["data"]}
    assert "plain" in names and len(names) == 5
    assert all(name.startswith("key-") for name in names - {"plain"})
    proxy.app[EVENTS].flush()
    await proxy.app[STORE].close()  # everything on disk, for the scan
    raw = stored_bytes(data)
    assert REDACTED.encode() in raw and b"plain" in raw  # the scan does read the recording
    for secret in (HEADER_SECRET, IN_KEY, ALICE, BOB, ADMIN):
        assert secret.encode() not in raw, secret
        assert secret.encode() not in board, secret


def test_a_pattern_redacts_object_keys_and_keeps_keys_redacted_alike_apart() -> None:
    redaction = matcher(None, ()).value  # nothing to redact: the same object back
    value = {"a": {"b": 1}}
    assert redaction(value) is value
    pattern = matcher(__import__("re").compile(KEY_PATTERN), ())
    clean = pattern.value({"x": 1, "PRIVATE-1": {"PRIVATE-2": "PRIVATE-3"}, "PRIVATE-4": [2]})
    assert clean == {"x": 1, REDACTED: {REDACTED: REDACTED}, f"{REDACTED} (2)": [2]}
    assert list(clean) == ["x", REDACTED, f"{REDACTED} (2)"]  # the order kept
    assert scoped("key:alice", "x") == "key:alice/x"
