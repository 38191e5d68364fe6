"""Relaying an upstream Gemini stream (`streamGenerateContent?alt=sse`) to the client, chunk by
chunk as the bytes arrive. Each chunk is a whole GenerateContentResponse holding the next parts;
the last one carries the finish reason and the usage.

When the proxy offered its recall tool, everything from the first chunk with a functionCall on
is held until the stream ends: if the model only called `agentproxy_recall`, the proxy answers
and streams the next round into the same response.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.errors import ProxyError, UpstreamBadResponse
from proxy.exchange import Exchange
from proxy.guards.tool_rules import Verdict
from proxy.messages import Message
from proxy.upstream.base import UpstreamHTTPError, UpstreamStream
from proxy.upstream.priming import data_of, is_json_object
from proxy.wire.gemini.replies import (
    client_calls,
    denied_positions,
    error_body,
    first_parts,
    is_recall,
    passthrough_body,
)
from proxy.wire.gemini.request import field as read
from proxy.wire.gemini.upstream import gemini_usage
from proxy.wire.gemini.view import GeminiView
from proxy.wire.relay import StreamRelay, nonempty


def frame(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


@dataclass(slots=True)
class Held:
    """The chunks kept from the client from the first functionCall on, and the turn."""

    view: GeminiView
    prefix: str
    chunks: list[dict[str, Any]] = field(default_factory=list)
    parts: list[dict[str, Any]] = field(default_factory=list)  # the whole round's

    def message(self) -> Message:
        return self.view.remember_turn(self.parts, self.prefix)


class Relay(StreamRelay):
    """Writes one Gemini response stream to the client over the rounds' upstream streams."""

    error_prefix = b"data: "
    token_marks = (b'"text"', b'"functionCall"')

    def carries_token(self, data: dict[str, Any]) -> bool:
        return any(nonempty(p.get("text")) or read(p, "functionCall") for p in first_parts(data))

    def __init__(
        self, request: web.Request, ex: Exchange, response: web.StreamResponse, view: GeminiView
    ) -> None:
        super().__init__(request, ex, response)
        self.view = view
        self._rounds = 0

    async def run(self, source: UpstreamStream) -> Held | None:
        self._rounds += 1
        held: Held | None = await super().run(source)
        return held

    async def release(self, held: Held, verdict: Verdict | None) -> None:
        """The held chunks without the recall calls and those the guard denied (a chunk left
        with nothing dropped), its text first, in a chunk of its own."""
        out = bytearray()
        seen = client_calls(held.parts) - sum(client_calls(first_parts(c)) for c in held.chunks)
        if verdict is not None:
            text = {"content": {"role": "model", "parts": [{"text": verdict.text}]}, "index": 0}
            out += frame({"candidates": [text]})
        for chunk in held.chunks:
            parts = first_parts(chunk)
            denied = set() if verdict is None else denied_positions(parts, verdict, seen)
            seen += client_calls(parts)
            kept = _without(chunk, denied)
            if kept is not None:
                out += frame(kept)
        await self.write(bytes(out))

    def error_data(self, error: ProxyError | UpstreamHTTPError) -> bytes:
        if isinstance(error, UpstreamHTTPError):
            return passthrough_body(error, self.ex.identity.request_id)
        return orjson.dumps(error_body(error, self.ex.identity.request_id))

    async def _relay(self, source: UpstreamStream) -> Held | None:
        finished = False
        usage: Any = None
        watch = self.hold_tool_calls or self.watch_tool is not None
        held: Held | None = None
        parts: list[dict[str, Any]] = []
        async for batch in self.batches(source):
            out = bytearray()
            for event in batch:
                data = self._read(event, watch)
                if data is not None:
                    usage = read(data, "usageMetadata") or usage
                    if any(read(c, "finishReason") for c in data.get("candidates") or ()):
                        finished = True
                    if watch:
                        chunk_parts = first_parts(data)
                        parts += chunk_parts
                        if held is None and self._holds(chunk_parts):
                            held = Held(self.view, f"stream{self._rounds}")
                        if held is not None:
                            held.chunks.append(data)
                            continue
                out += event + b"\n\n"
            if out:
                await self.write(bytes(out))
        if usage is not None and (counted := gemini_usage(usage)) is not None:
            self.ex.add_usage(counted)
            self.usage_reported = True
        if not finished:
            raise UpstreamBadResponse(
                f"the upstream for '{self.ex.alias}' ended the stream before a finishReason"
            )
        if held is not None:
            held.parts = parts
        return held

    def _holds(self, parts: list[dict[str, Any]]) -> bool:
        """The chunk begins what must be held: any call when recall was offered, a call of a
        tool a guard rule could match."""
        calls = [call for p in parts if isinstance(call := read(p, "functionCall"), dict)]
        if self.hold_tool_calls or not calls:
            return bool(calls)
        watch = self.watch_tool
        return watch is not None and any(
            isinstance(c.get("name"), str) and watch(c["name"]) for c in calls
        )

    def _read(self, event: bytes, watch: bool) -> dict[str, Any] | None:
        """The chunk parsed when it carries the end (and the usage) or must be watched."""
        payload = data_of(event)
        if payload is None:
            return None
        if not is_json_object(payload):
            raise UpstreamBadResponse(
                f"the upstream for '{self.ex.alias}' sent a stream event that is not a JSON "
                f"object: {payload[:60]!r}"
            )
        if not watch and b"finishReason" not in payload and b"usageMetadata" not in payload:
            return None
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise UpstreamBadResponse(
                f"the upstream for '{self.ex.alias}' sent a stream event that is not JSON: "
                f"{payload[:60]!r}"
            ) from None
        return data if isinstance(data, dict) else None


def _without(chunk: dict[str, Any], denied: set[int]) -> dict[str, Any] | None:
    """The chunk without the recall calls and the parts at `denied`; None: nothing left."""
    parts = first_parts(chunk)
    kept = [p for i, p in enumerate(parts) if not is_recall(p) and i not in denied]
    if len(kept) == len(parts):
        return chunk
    candidates = chunk.get("candidates") or [{}]
    first = dict(candidates[0])
    if not kept and not read(first, "finishReason") and not read(chunk, "usageMetadata"):
        return None
    first["content"] = {**(first.get("content") or {}), "parts": kept or [{"text": ""}]}
    return {**chunk, "candidates": [first, *candidates[1:]]}


def response_stream(response: dict[str, Any]) -> bytes:
    """A whole response as the chunks a Gemini client reads (a degraded answer, or a
    translated reply that came back whole): its text first, then the rest with the end."""
    parts = first_parts(response)
    texts = [p for p in parts if set(p) == {"text"}]
    if not texts or len(parts) == 1:
        return frame(response)
    first = {"candidates": [{"content": {"role": "model", "parts": texts}, "index": 0}]}
    rest = [p for p in parts if p not in texts]
    candidate = dict(response["candidates"][0])
    candidate["content"] = {"role": "model", "parts": rest or [{"text": ""}]}
    return frame({**first, "modelVersion": response.get("modelVersion")}) + frame(
        {**response, "candidates": [candidate]}
    )
