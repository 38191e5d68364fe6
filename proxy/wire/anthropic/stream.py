"""Relaying an upstream Anthropic Messages stream to the client, event by event as the bytes
arrive (message_start, content_block_start/delta/stop, ping, message_delta, message_stop).

Usage is read from message_start (input and prompt-cache tokens) and message_delta (output).
When the proxy offered its recall tool, everything from the first tool_use block on is held
until the stream ends: if the model only called `agentproxy_recall`, the proxy answers and
streams the next round into the same response, its message_start left out and its content
blocks numbered on from those the client already has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.errors import ProxyError, UpstreamBadResponse
from proxy.exchange import Exchange, Usage
from proxy.guards.tool_rules import Verdict
from proxy.messages import Message
from proxy.pipeline import recall
from proxy.state import TURN_MEMORY
from proxy.upstream.base import UpstreamHTTPError, UpstreamStream
from proxy.upstream.priming import data_of, is_json_object
from proxy.wire.anthropic.replies import (
    denied_indexes,
    error_body,
    passthrough_body,
    text_block,
)
from proxy.wire.anthropic.thinking import THINKING, remember, thinking_on
from proxy.wire.anthropic.upstream import anthropic_usage
from proxy.wire.anthropic.view import AnthropicView, assistant_message
from proxy.wire.relay import StreamRelay, nonempty

Event = tuple[str, dict[str, Any]]  # (event name, parsed data)


def frame(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


@dataclass(slots=True)
class Blocks:
    """The content blocks of one streamed message, rebuilt from their deltas: what a recall
    round sends back (thinking blocks with their signatures included)."""

    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    _json: dict[int, str] = field(default_factory=dict)  # tool_use input, as it arrives

    def add(self, name: str, data: dict[str, Any]) -> None:
        index = data.get("index")
        if not isinstance(index, int):
            return
        if name == "content_block_start" and isinstance(data.get("content_block"), dict):
            self.blocks[index] = dict(data["content_block"])
        elif name == "content_block_delta" and index in self.blocks:
            block, delta = self.blocks[index], data.get("delta") or {}
            kind = delta.get("type")
            if kind == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif kind == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
            elif kind == "signature_delta":
                block["signature"] = delta.get("signature")
            elif kind == "input_json_delta":
                self._json[index] = self._json.get(index, "") + str(delta.get("partial_json", ""))
        elif name == "content_block_stop" and index in self._json:
            try:
                self.blocks[index]["input"] = orjson.loads(self._json.pop(index) or "{}")
            except orjson.JSONDecodeError:
                self.blocks[index]["input"] = {}

    def content(self) -> list[dict[str, Any]]:
        return [self.blocks[i] for i in sorted(self.blocks)]


@dataclass(slots=True)
class ThinkingCapture:
    """A relayed stream's thinking blocks (text and signature deltas) and tool_use blocks,
    to put back what a client drops (thinking.py): only block starts and a thinking block's
    deltas are parsed, text and tool input pass by as bytes."""

    blocks: Blocks = field(default_factory=Blocks)
    _open: int | None = None  # the index of the thinking block being streamed

    def see(self, name: str, event: bytes, data: dict[str, Any] | None) -> None:
        if name == "content_block_start":
            data = data if data is not None else _parsed(event)
            block = data.get("content_block") if data else None
            kind = block.get("type") if isinstance(block, dict) else None
            if data is not None and (kind in THINKING or kind == "tool_use"):
                self.blocks.add(name, data)
                self._open = data.get("index") if kind == "thinking" else None
        elif name == "content_block_delta" and self._open is not None:
            data = data if data is not None else _parsed(event)
            if data is not None and data.get("index") == self._open:
                self.blocks.add(name, data)
        elif name == "content_block_stop":
            self._open = None


def _parsed(event: bytes) -> dict[str, Any] | None:
    payload = data_of(event)
    try:
        data = orjson.loads(payload) if payload is not None else None
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


@dataclass(slots=True)
class Held:
    """The events kept from the client from the first tool_use block on, and the message."""

    events: list[Event]
    blocks: Blocks

    def message(self) -> Message:
        return assistant_message(self.blocks.content())

    def recall_indexes(self) -> set[int]:
        return {
            i
            for i, b in self.blocks.blocks.items()
            if b.get("type") == "tool_use" and b.get("name") == recall.TOOL_NAME
        }


class Relay(StreamRelay):
    """Writes one Anthropic response stream to the client over the rounds' upstream streams."""

    token_marks = (b"content_block_delta",)  # text, tool input JSON or thinking

    def carries_token(self, data: dict[str, Any]) -> bool:
        # Not a tool's opening `partial_json: ""`, nor a thinking block's signature.
        delta = data.get("delta") if data.get("type") == "content_block_delta" else None
        return isinstance(delta, dict) and any(
            nonempty(delta.get(key)) for key in ("text", "partial_json", "thinking")
        )

    def __init__(
        self,
        request: web.Request,
        ex: Exchange,
        response: web.StreamResponse,
        view: AnthropicView,
        provider_edits: Callable[[Any], None] | None = None,
    ) -> None:
        super().__init__(request, ex, response)
        self.view = view
        # Told of the provider's `context_management` in message_delta (its applied edits).
        self.provider_edits = provider_edits
        self._rounds = 0
        self._offset = 0  # content blocks the client already has, from earlier rounds
        self._sent_blocks = 0  # ...and from this round, so far

    async def run(self, source: UpstreamStream) -> Held | None:
        self._rounds += 1
        self._offset += self._sent_blocks
        self._sent_blocks = 0
        held: Held | None = await super().run(source)
        return held

    async def release(self, held: Held, verdict: Verdict | None) -> None:
        """The held events without the recall blocks and the denied ones (the rest
        renumbered), the guard's text as a block of its own, and the end."""
        dropped = held.recall_indexes()
        if verdict is not None:
            dropped |= denied_indexes(held.blocks.blocks, verdict)
        left = any(
            b.get("type") == "tool_use" for i, b in held.blocks.blocks.items() if i not in dropped
        )
        out = bytearray()
        for name, data in held.events:
            index = data.get("index")
            if isinstance(index, int):
                if index in dropped:
                    continue
                data = {**data, "index": index - sum(1 for d in dropped if d < index)}
            if name == "message_delta" and verdict is not None:
                for said_name, said in _text_events(
                    len(held.blocks.blocks) - len(dropped), verdict.text
                ):
                    out += frame(said_name, self._shifted(said))
            if name == "message_delta" and not left:
                delta = {**(data.get("delta") or {}), "stop_reason": "end_turn"}
                data = {**data, "delta": delta}
            out += frame(name, self._shifted(data))
        await self.write(bytes(out))

    def error_data(self, error: ProxyError | UpstreamHTTPError) -> bytes:
        if isinstance(error, UpstreamHTTPError):
            return passthrough_body(error, self.ex.identity.request_id)
        return orjson.dumps(error_body(error, self.ex.identity.request_id))

    async def _relay(self, source: UpstreamStream) -> Held | None:
        ex, stopped = self.ex, False
        held: Held | None = None
        watch = self.hold_tool_calls or self._rounds > 1 or self.watch_tool is not None
        blocks = Blocks() if self.hold_tool_calls or self.watch_tool is not None else None
        capture = ThinkingCapture() if thinking_on(self.view.body) else None
        async for batch in self.batches(source):
            out = bytearray()
            for event in batch:
                name, data = self._read(event)
                if name == "message_stop":
                    stopped = True
                if data is not None:
                    self._account(name, data)
                if capture is not None:
                    capture.see(name, event, data)
                if not watch or data is None:  # the common case: passed on untouched
                    if name.startswith("content_block_start"):
                        self._sent_blocks += 1
                    out += event + b"\n\n"
                    continue
                if blocks is not None:
                    blocks.add(name, data)
                if held is None and self._holds(name, data):
                    held = Held([], blocks or Blocks())
                if held is not None:
                    held.events.append((name, data))
                    continue
                if self._rounds > 1 and name in ("message_start", "ping"):
                    continue  # the client's message began in the first round
                if name == "content_block_start":
                    self._sent_blocks += 1
                # The first round's bytes go out as they came; later rounds are renumbered.
                out += event + b"\n\n" if self._rounds == 1 else frame(name, self._shifted(data))
            if out:
                await self.write(bytes(out))
        if not stopped:
            raise UpstreamBadResponse(
                f"the upstream for '{ex.alias}' ended the stream before 'message_stop'"
            )
        if held is not None:  # continued by a recall round: the turn goes back whole
            self.view.remember_turn(held.blocks.content())
        if capture is not None:
            memory = self.request.app[TURN_MEMORY]
            relayed = capture.blocks.content()
            remember(memory, ex.identity.owner, self.view.memory_session, relayed)
        return held

    def _read(self, event: bytes) -> tuple[str, dict[str, Any] | None]:
        """The event's name, and its data parsed when it carries usage or must be watched."""
        name = event[7 : event.find(b"\n")].strip().decode() if event.startswith(b"event:") else ""
        payload = data_of(event)
        if payload is None:
            return name, None
        if not is_json_object(payload):
            raise UpstreamBadResponse(
                f"the upstream for '{self.ex.alias}' sent a stream event that is not a JSON "
                f"object: {payload[:60]!r}"
            )
        watched = self.hold_tool_calls or self._rounds > 1 or self.watch_tool is not None
        if not watched and name not in ("message_start", "message_delta"):
            return name, None
        try:
            data: dict[str, Any] = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise UpstreamBadResponse(
                f"the upstream for '{self.ex.alias}' sent a stream event that is not JSON: "
                f"{payload[:60]!r}"
            ) from None
        return name or str(data.get("type", "")), data

    def _holds(self, name: str, data: dict[str, Any]) -> bool:
        """The event begins what must be held: a tool_use block, when recall was offered or
        a guard rule could match its tool."""
        if not _starts_tool_use(name, data):
            return False
        if self.hold_tool_calls:
            return True
        tool = data["content_block"].get("name")
        return self.watch_tool is not None and isinstance(tool, str) and self.watch_tool(tool)

    def _account(self, name: str, data: dict[str, Any]) -> None:
        if name == "message_start":
            usage = anthropic_usage((data.get("message") or {}).get("usage"))
            if usage is not None:  # the prompt; output follows in message_delta
                usage.completion_tokens = 0
                self.ex.add_usage(usage)
        elif name == "message_delta":
            output = (data.get("usage") or {}).get("output_tokens")
            if isinstance(output, int):
                self.ex.add_usage(Usage(0, output))
                self.usage_reported = True
            if self.provider_edits is not None and "context_management" in data:
                self.provider_edits(data["context_management"])

    def _shifted(self, data: dict[str, Any]) -> dict[str, Any]:
        index = data.get("index")
        if self._offset and isinstance(index, int):
            return {**data, "index": index + self._offset}
        return data


def _starts_tool_use(name: str, data: dict[str, Any]) -> bool:
    block = data.get("content_block")
    return (
        name == "content_block_start"
        and isinstance(block, dict)
        and block.get("type") == "tool_use"
    )


def _text_events(index: int, text: str) -> list[Event]:
    """A text block of its own, whole (the guard's refusal)."""
    return [
        (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": text_block("")},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": text},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def message_stream(message: dict[str, Any]) -> bytes:
    """A whole message as the event sequence an Anthropic client expects (a degraded answer,
    or a translated reply that came back whole)."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start.pop("context_management", None)  # reported in message_delta, as Anthropic does
    events: list[Event] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message.get("content") or []):
        kind = block.get("type")
        first: dict[str, Any]
        delta: dict[str, Any] | None
        if kind == "text":
            first, delta = (
                {"type": "text", "text": ""},
                {"type": "text_delta", "text": block["text"]},
            )
        elif kind == "compaction":  # the summary arrives whole, in one compaction_delta
            first = {"type": "compaction", "content": None}
            delta = {"type": "compaction_delta", "content": block.get("content")}
        elif kind == "tool_use":
            first = {**block, "input": {}}
            delta = {
                "type": "input_json_delta",
                "partial_json": orjson.dumps(block["input"]).decode(),
            }
        else:
            first, delta = block, None
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": first},
            )
        )
        if delta is not None:
            events.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    usage = message.get("usage") or {}
    stop = {"stop_reason": message.get("stop_reason"), "stop_sequence": None}
    ending: dict[str, Any] = {
        "type": "message_delta",
        "delta": stop,
        "usage": {"output_tokens": usage.get("output_tokens", 0)},
    }
    if "context_management" in message:
        ending["context_management"] = message["context_management"]
    events.append(("message_delta", ending))
    events.append(("message_stop", {"type": "message_stop"}))
    return b"".join(frame(name, data) for name, data in events)
