"""Relaying an upstream OpenAI Responses stream to the client, event by event as the bytes
arrive (response.created … response.output_text.delta … response.completed).

Usage is read from the terminal event (response.completed, .incomplete or .failed). When the
proxy offered its recall tool, a round is kept whole until it ends: if the model only called
`agentproxy_recall`, the proxy answers and the client sees the next round instead; otherwise
the round goes out with the proxy's calls taken out. (Only requests whose history lost
something to the archive are offered recall; their first byte waits for the round's end.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.errors import ProxyError, UpstreamBadResponse
from proxy.exchange import Exchange
from proxy.guards.tool_rules import Verdict
from proxy.messages import Message
from proxy.pipeline import recall
from proxy.upstream.base import UpstreamHTTPError, UpstreamStream
from proxy.upstream.priming import data_of, is_json_object
from proxy.wire.chat.replies import passthrough_body
from proxy.wire.relay import StreamRelay, nonempty
from proxy.wire.responses.replies import (
    denied_items,
    reply_message,
    said_item,
)
from proxy.wire.responses.upstream import responses_usage
from proxy.wire.responses.view import CALLS, ResponsesView

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def frame(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


@dataclass(slots=True)
class Held:
    """One whole round, kept from the client: its events and the response it ended with."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    output: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> Message:
        return reply_message(self.output)


class Relay(StreamRelay):
    # response.output_text.delta, response.function_call_arguments.delta, reasoning deltas.
    token_marks = (b".delta",)

    def carries_token(self, data: dict[str, Any]) -> bool:
        kind = data.get("type")
        return isinstance(kind, str) and kind.endswith(".delta") and nonempty(data.get("delta"))

    def __init__(
        self,
        request: web.Request,
        ex: Exchange,
        response: web.StreamResponse,
        view: ResponsesView,
        ended: Callable[[Any], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(request, ex, response)
        self.view = view
        # Given the terminal event's response before that event goes out (its owner's record).
        self.ended = ended

    async def release(self, held: Held, verdict: Verdict | None) -> None:
        """The kept events, without the proxy's calls and those the guard denied (later items
        renumbered), its text as a message item of its own, numbered on from the events the
        client already has."""
        dropped = {
            i
            for i, item in enumerate(held.output)
            if item.get("type") in CALLS and item.get("name") == recall.TOOL_NAME
        }
        if verdict is not None:
            dropped |= denied_items(held.output, verdict)
        out = bytearray()
        first = held.events[0][1].get("sequence_number") if held.events else None
        sequence = first if isinstance(first, int) else 0
        for name, data in held.events:
            index = data.get("output_index")
            if isinstance(index, int):
                if index in dropped:
                    continue
                data = {**data, "output_index": index - sum(1 for d in dropped if d < index)}
            if name in TERMINAL and isinstance(data.get("response"), dict):
                response = data["response"]
                output = response.get("output") or []
                output = [i for n, i in enumerate(output) if n not in dropped]
                if verdict is not None:
                    said = said_item(verdict.text, f"msg_guard_{response.get('id', '')}")
                    for event in _said_events(said, len(output)):
                        out += frame(event["type"], {**event, "sequence_number": sequence})
                        sequence += 1
                    output = [*output, said]
                data = {**data, "response": {**response, "output": output}}
            if "sequence_number" in data:
                data = {**data, "sequence_number": sequence}
                sequence += 1
            out += frame(name, data)
        await self.write(bytes(out))

    def error_data(self, error: ProxyError | UpstreamHTTPError) -> bytes:
        if isinstance(error, UpstreamHTTPError):
            return passthrough_body(error, self.ex.identity.request_id)
        return super().error_data(error)

    async def _relay(self, source: UpstreamStream) -> Held | None:
        ex, ended = self.ex, False
        held = Held() if self.hold_tool_calls else None
        async for batch in self.batches(source):
            out = bytearray()
            for event in batch:
                name = _name(event)
                if held is None and name not in TERMINAL:
                    if not self._holds(name, event):
                        out += event + b"\n\n"  # the common case: passed on untouched
                        continue
                    held = Held()
                data = self._parse(event)
                if name in TERMINAL:
                    ended = True
                    self._account(data)
                    if self.ended is not None:
                        await self.ended(data.get("response"))
                if held is None:
                    out += event + b"\n\n"
                    continue
                held.events.append((name, data))
                if name in TERMINAL:
                    response = data.get("response") or {}
                    held.output = [i for i in response.get("output") or [] if isinstance(i, dict)]
            if out:
                await self.write(bytes(out))
        if not ended:
            raise UpstreamBadResponse(
                f"the upstream for '{ex.alias}' ended the stream before 'response.completed'"
            )
        if held is not None:
            self.view.remember_turn(held.output)
        return held

    def _holds(self, name: str, event: bytes) -> bool:
        """The event opens a call of a tool a guard rule could match: held from here."""
        if self.watch_tool is None or name != "response.output_item.added":
            return False
        item = self._parse(event).get("item")
        if not isinstance(item, dict) or item.get("type") not in CALLS:
            return False
        tool = item.get("name")
        return isinstance(tool, str) and self.watch_tool(tool)

    def _parse(self, event: bytes) -> dict[str, Any]:
        payload = data_of(event)
        if payload is None or not is_json_object(payload):
            raise UpstreamBadResponse(
                f"the upstream for '{self.ex.alias}' sent a stream event that is not a JSON "
                f"object: {event[:60]!r}"
            )
        try:
            data: dict[str, Any] = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise UpstreamBadResponse(
                f"the upstream for '{self.ex.alias}' sent a stream event that is not JSON: "
                f"{payload[:60]!r}"
            ) from None
        return data

    def _account(self, data: dict[str, Any]) -> None:
        usage = responses_usage((data.get("response") or {}).get("usage"))
        if usage is not None:
            self.ex.add_usage(usage)
            self.usage_reported = True


def _name(event: bytes) -> str:
    """The event's name from its `event:` line; else the `type` in its data (cheaply)."""
    if event.startswith(b"event:"):
        return event[6 : event.find(b"\n")].strip().decode()
    payload = data_of(event) or b""
    at = payload.find(b'"type"')
    if at < 0:
        return ""
    # `"type":"x"`, or spaced as JSON allows (`"type" : "x"`).
    value = payload[at + 6 : at + 64].lstrip(b" \t\r\n")
    if not value.startswith(b":"):
        return ""
    value = value[1:].lstrip(b" \t\r\n")
    end = value.find(b'"', 1)
    return value[1:end].decode() if value.startswith(b'"') and end > 0 else ""


def _said_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """A whole message item as the events that stream one (the guard's text)."""
    part = item["content"][0]
    text = part["text"]
    opened = {**item, "status": "in_progress", "content": []}
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [
        {"type": "response.output_item.added", "output_index": index, "item": opened},
        {"type": "response.content_part.added", **where, "part": {**part, "text": ""}},
        {"type": "response.output_text.delta", **where, "delta": text, "logprobs": []},
        {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **where, "part": part},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]
