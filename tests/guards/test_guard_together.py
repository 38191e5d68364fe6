"""The guard's two parts on one answer: the secrets given back (guards/secrets/restore.py) and
the tool-call rules (guards/tool_rules.py). A rule judges a call's arguments as the client
would get them, its placeholders given back: `arguments: 'AKIA…'` denies a call the model
wrote with the placeholder of an AWS key. A scripted upstream (aiohttp) answers with the
placeholder it was sent, in its text (cut into three-character stream pieces) and in two Bash
calls: one that a rule denies (only on the real key), one that passes and gets the real key.
Real SDKs (openai chat, anthropic), whole and streamed, over real sockets."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.state import EVENTS
from tests.conftest import ProxyFactory
from tests.support.scrape import metrics_of, sample

KEY = "sk-proxy-together-1"
SECRET = "AKIAIOSFODNN7EXAMPLE"  # an AWS access key id, the kind the guard knows
PLACEHOLDER = re.compile(r"«secret:[0-9a-f]{12}»")
REASON = "no AWS calls with a real key from agents"
RULES = """\
      tool_calls:
        - name: no-aws-keys
          match: {tool: Bash, arguments: 'aws\\s.*AKIA[0-9A-Z]{16}'}
          action: deny
          reason: no AWS calls with a real key from agents
"""
BASH: Any = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}


def pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def calls_for(said: str) -> list[dict[str, str]]:
    """The two calls the model makes with the placeholder it was sent: the first is denied
    (once its placeholder is given back), the second passes."""
    return [
        {"command": f"aws s3 ls --access-key {said}"},
        {"command": f"echo {said} > key.txt"},
    ]


class Scripted:
    """Answers chat and Messages requests, whole or streamed, with the placeholder it was
    sent in its text and in two Bash calls."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/messages", self.messages)
        return app

    def read(self, raw: bytes) -> tuple[str, bool]:
        self.received.append(raw)
        # The placeholder it was sent; the key itself when it was sent that (a dry run).
        found = PLACEHOLDER.search(raw.decode()) or re.search(SECRET, raw.decode())
        return (found.group(0) if found else "none"), bool(orjson.loads(raw).get("stream"))

    async def stream(self, request: web.Request, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(event)
        await response.write_eof()
        return response

    async def chat(self, request: web.Request) -> web.StreamResponse:
        said, streamed = self.read(await request.read())
        text, calls = f"the key is {said}.", calls_for(said)
        if not streamed:
            tool_calls = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": orjson.dumps(c).decode()},
                }
                for i, c in enumerate(calls)
            ]
            message = {"role": "assistant", "content": text, "tool_calls": tool_calls}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            usage = {"prompt_tokens": 9, "completion_tokens": 9, "total_tokens": 18}
            body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m"}
            return web.json_response({**body, "choices": [choice], "usage": usage})

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            data = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
            return b"data: " + orjson.dumps({**data, "choices": [choice]}) + b"\n\n"

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": p}) for p in pieces(text)]
        for index, call in enumerate(calls):
            head = {"index": index, "id": f"call_{index}", "type": "function"}
            events.append(chunk({"tool_calls": [{**head, "function": {"name": "Bash"}}]}))
            events += [
                chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
                for p in pieces(orjson.dumps(call).decode())
            ]
        events += [chunk({}, "tool_calls"), b"data: [DONE]\n\n"]
        return await self.stream(request, events)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        said, streamed = self.read(await request.read())
        text, calls = f"the key is {said}.", calls_for(said)
        message: dict[str, Any] = {"id": "msg_1", "type": "message", "role": "assistant"}
        message |= {"model": "m", "stop_sequence": None}
        if not streamed:
            content: list[dict[str, Any]] = [{"type": "text", "text": text}]
            content += [
                {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": c}
                for i, c in enumerate(calls)
            ]
            usage = {"input_tokens": 9, "output_tokens": 9}
            return web.json_response(
                {**message, "content": content, "stop_reason": "tool_use", "usage": usage}
            )

        def event(name: str, data: dict[str, Any]) -> bytes:
            payload = orjson.dumps({"type": name, **data})
            return f"event: {name}\ndata: ".encode() + payload + b"\n\n"

        message |= {
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 5, "output_tokens": 1},
        }
        delta = "content_block_delta"
        events = [event("message_start", {"message": message})]
        block = {"type": "text", "text": ""}
        events.append(event("content_block_start", {"index": 0, "content_block": block}))
        events += [
            event(delta, {"index": 0, "delta": {"type": "text_delta", "text": p}})
            for p in pieces(text)
        ]
        events.append(event("content_block_stop", {"index": 0}))
        for index, call in enumerate(calls, start=1):
            use = {"type": "tool_use", "id": f"toolu_{index}", "name": "Bash", "input": {}}
            events.append(event("content_block_start", {"index": index, "content_block": use}))
            events += [
                event(
                    delta,
                    {"index": index, "delta": {"type": "input_json_delta", "partial_json": p}},
                )
                for p in pieces(orjson.dumps(call).decode())
            ]
            events.append(event("content_block_stop", {"index": index}))
        done = {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}
        events += [event("message_delta", done), event("message_stop", {})]
        return await self.stream(request, events)


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, mode: str = "enforce"
) -> TestServer:
    url = str(upstream.make_url("")).rstrip("/")
    text = textwrap.dedent(
        f"""\
        store: {{path: {tmp_path / "state"}}}
        keys:
          api_keys: [{{name: agent, key: {KEY}}}]
        model_list:
          - model_name: gpt-x
            litellm_params: {{model: openai/x, api_base: {url}/v1, api_key: sk-up}}
          - model_name: claude-x
            litellm_params: {{model: anthropic/x, api_base: {url}, api_key: sk-up}}
        policies:
          - name: guarded
            guard:
              mode: {mode}
              secrets: {{scrub: true}}
        """
    )
    path = tmp_path / "together.yaml"
    path.write_text(text + RULES)
    return await start_proxy(path)


Answer = tuple[str, list[dict[str, Any]], str | None, dict[str, str]]


async def chat(proxy: TestServer, streamed: bool) -> Answer:
    tools: Any = [{"type": "function", "function": {"name": "Bash", "parameters": BASH}}]
    messages: Any = [{"role": "user", "content": f"my AWS key is {SECRET}; check the bucket"}]
    async with openai.AsyncOpenAI(
        base_url=str(proxy.make_url("/v1")), api_key=KEY, max_retries=0
    ) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model="gpt-x", messages=messages, tools=tools, stream=streamed
        )
        if not streamed:
            reply = raw.parse()
            message = reply.choices[0].message
            calls = [
                orjson.loads(c.function.arguments)  # type: ignore[union-attr]
                for c in message.tool_calls or []
            ]
            finish = reply.choices[0].finish_reason
            return message.content or "", calls, finish, dict(raw.headers)
        text, arguments, finish = "", {}, None
        async for chunk in raw.parse():
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
                for call in choice.delta.tool_calls or []:
                    piece = (call.function and call.function.arguments) or ""
                    arguments[call.index] = arguments.get(call.index, "") + piece
        calls = [orjson.loads(arguments[i]) for i in sorted(arguments)]
        return text, calls, finish, dict(raw.headers)


async def messages(proxy: TestServer, streamed: bool) -> Answer:
    base = str(proxy.make_url("")).rstrip("/")
    tools: Any = [{"name": "Bash", "input_schema": BASH}]
    said: Any = [{"role": "user", "content": f"my AWS key is {SECRET}; check the bucket"}]
    async with anthropic.AsyncAnthropic(base_url=base, api_key=KEY, max_retries=0) as sdk:
        if streamed:
            async with sdk.messages.stream(
                model="claude-x", max_tokens=64, messages=said, tools=tools
            ) as stream:
                message = await stream.get_final_message()
            headers: dict[str, str] = {}
        else:
            raw = await sdk.messages.with_raw_response.create(
                model="claude-x", max_tokens=64, messages=said, tools=tools
            )
            message, headers = await raw.parse(), dict(raw.headers)
    text = "".join(b.text for b in message.content if b.type == "text")
    calls = [dict(b.input) for b in message.content if b.type == "tool_use"]  # type: ignore[call-overload]
    return text, calls, message.stop_reason, headers


WIRES = {"chat": chat, "anthropic": messages}


def guard_events(proxy: TestServer, tmp_path: Path) -> list[dict[str, Any]]:
    proxy.app[EVENTS].flush()
    with (tmp_path / "state" / "events.jsonl").open() as lines:
        events = [orjson.loads(line) for line in lines]
    return [e for e in events if e.get("stage") == "guard"]


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("wire", list(WIRES))
async def test_a_rule_judges_the_arguments_with_their_secrets_given_back(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, wire: str, streamed: bool
) -> None:
    scripted = Scripted()
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(scripted.app()))
    text, calls, finish, headers = await WIRES[wire](proxy, streamed)

    # The provider saw the placeholder only, and answered with it.
    assert SECRET.encode() not in scripted.received[-1]
    assert PLACEHOLDER.search(scripted.received[-1].decode())
    # The text's placeholder (cut into stream pieces) comes back as the secret, before the
    # guard's refusal: a rule over `aws … AKIA…` matched the call the model wrote with the
    # placeholder, since it judges what the client would run.
    assert text.startswith(f"the key is {SECRET}.")
    assert "[agentproxy guard] The tool call `Bash` was refused" in text
    assert REASON in text
    # The refusal says nothing of the arguments: neither the secret nor its placeholder.
    refusal = text[len(f"the key is {SECRET}.") :]
    assert SECRET not in refusal and "«secret:" not in refusal
    # The call that passed carries the real key; the denied one never reached the client.
    assert calls == [{"command": f"echo {SECRET} > key.txt"}]
    assert finish in ("tool_calls", "tool_use")  # a call is left: the agent runs it
    if not streamed:
        applied = headers["x-agentproxy-applied"]
        assert "guard.scrub" in applied and "guard.deny" in applied
    events = guard_events(proxy, tmp_path)
    assert [e["action"] for e in events] == ["scrub", "deny"]  # scrubbed up, judged down
    assert SECRET not in orjson.dumps(events).decode()  # never logged
    metrics = await metrics_of(proxy)
    assert sample(metrics, "agentproxy_guard_total", action="scrub", rule="aws_access_key") == 1
    assert sample(metrics, "agentproxy_guard_total", action="deny", rule="no-aws-keys") == 1


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_the_guards_dry_run_scrubs_nothing_and_denies_nothing(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any, streamed: bool
) -> None:
    """`guard.mode: dry_run` (the policy itself enforcing): both parts report what they
    would do through one mode (guards/mode.py), and the request and answer pass as they
    came."""
    scripted = Scripted()
    upstream = await aiohttp_server(scripted.app())
    proxy = await start(start_proxy, tmp_path, upstream, mode="dry_run")
    text, calls, finish, headers = await chat(proxy, streamed)

    assert SECRET.encode() in scripted.received[-1]  # sent as the client sent it
    assert text == f"the key is {SECRET}."  # the model saw the key and wrote it
    assert calls == [
        {"command": f"aws s3 ls --access-key {SECRET}"},
        {"command": f"echo {SECRET} > key.txt"},
    ]
    assert finish == "tool_calls"
    if not streamed:
        applied = headers["x-agentproxy-applied"]
        assert "guard.would_scrub" in applied and "guard.would_deny" in applied
    events = guard_events(proxy, tmp_path)
    assert [e["action"] for e in events] == ["would_scrub", "would_deny"]
