"""A Responses event stream, for a chat client whose request went as Responses
(proxy/wire/chat_as_responses.py), read as chat completion chunks: the chat relay then relays
it as any chat stream (recall rounds, the usage chunk kept or dropped as the client asked)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy.errors import UpstreamBadResponse
from proxy.exchange import Exchange
from proxy.upstream.base import UpstreamStream
from proxy.upstream.priming import data_of
from proxy.wire.chat_as_responses import CALLS, as_dict, chat_usage, finish_reason

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def chat_stream(ex: Exchange, source: UpstreamStream) -> UpstreamStream:
    """The source as chat chunks when it came from /v1/responses for this chat client."""
    sent = ex.sent
    if isinstance(sent, dict) and "input" in sent and "messages" not in sent:
        return ChunksFromEvents(source, ex.alias)
    return source


class ChunksFromEvents:
    """A Responses event stream read as chat completion chunks (then `data: [DONE]`): text
    deltas, tool calls with their arguments, the finish reason, and a usage chunk."""

    def __init__(self, source: UpstreamStream, alias: str) -> None:
        self.source = source
        self.headers = source.headers
        self.alias = alias
        self.id = "chatcmpl-"
        self.calls: dict[str, int] = {}  # a function call item's id: its tool-call index

    async def close(self) -> None:
        await self.source.close()

    async def events(self) -> AsyncIterator[list[bytes]]:
        async for batch in self.source.events():
            out: list[bytes] = []
            for event in batch:
                payload = data_of(event)
                if payload is None:
                    continue
                try:
                    data = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    raise UpstreamBadResponse(
                        f"the upstream for '{self.alias}' sent a stream event that is not "
                        f"JSON: {payload[:60]!r}"
                    ) from None
                if isinstance(data, dict):
                    out.extend(self._chunks(data))
            if out:
                yield out

    def _chunks(self, data: dict[str, Any]) -> list[bytes]:
        kind = data.get("type")
        if kind == "response.created":
            self.id = f"chatcmpl-{as_dict(data.get('response')).get('id') or ''}"
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "response.output_text.delta":
            return [self._chunk({"content": data.get("delta") or ""})]
        if kind == "response.output_item.added":
            item = as_dict(data.get("item"))
            if item.get("type") not in CALLS:
                return []
            index = self.calls[item.get("id") or ""] = len(self.calls)
            call: dict[str, Any] = {"index": index, "id": item.get("call_id")}
            if item.get("type") == "custom_tool_call":  # its text comes in deltas
                call |= {"type": "custom", "custom": {"name": item.get("name"), "input": ""}}
            else:
                call |= {
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": ""},
                }
            return [self._chunk({"tool_calls": [call]})]
        if kind == "response.function_call_arguments.delta":
            at = self.calls.get(data.get("item_id") or "")
            if at is None:
                return []
            call = {"index": at, "function": {"arguments": data.get("delta") or ""}}
            return [self._chunk({"tool_calls": [call]})]
        if kind == "response.custom_tool_call_input.delta":
            at = self.calls.get(data.get("item_id") or "")
            if at is None:
                return []
            call = {"index": at, "custom": {"input": data.get("delta") or ""}}
            return [self._chunk({"tool_calls": [call]})]
        if kind == "error" or kind == "response.failed":
            error = as_dict(data.get("error") or as_dict(data.get("response")).get("error"))
            raise UpstreamBadResponse(
                f"the upstream for '{self.alias}' failed the response: "
                f"{str(error.get('message') or kind)[:200]}"
            )
        if kind in TERMINAL:
            response = as_dict(data.get("response"))
            finish = finish_reason(response, list(self.calls))
            usage = {"id": self.id, "object": "chat.completion.chunk", "created": 0}
            usage |= {
                "model": self.alias,
                "choices": [],
                "usage": chat_usage(response.get("usage")),
            }
            return [
                self._chunk({}, finish),
                b"data: " + orjson.dumps(usage),
                b"data: [DONE]",
            ]
        return []

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": self.alias,
            "choices": [choice],
        }
        return b"data: " + orjson.dumps(chunk)
