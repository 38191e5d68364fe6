"""Relaying an upstream Chat Completions SSE stream to the client, event by event as the bytes
arrive.

Usage is captured for accounting, and the usage chunk the proxy asked for is hidden again. When
the proxy offered its recall tool, tool-call chunks are held back until the stream ends: if the
model only called `agentproxy_recall`, the proxy answers and streams the next round instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from proxy.errors import ProxyError, UpstreamBadResponse
from proxy.exchange import Usage
from proxy.guards.tool_rules import Verdict
from proxy.pipeline import recall
from proxy.upstream.base import UpstreamHTTPError, UpstreamStream
from proxy.upstream.priming import is_json_object
from proxy.wire.chat.replies import passthrough_body
from proxy.wire.relay import StreamRelay, nonempty

DONE = b"data: [DONE]\n\n"
TOOL = recall.TOOL_NAME


@dataclass(slots=True)
class HeldCalls:
    """Tool-call chunks kept from the client, and the calls they spell out."""

    events: list[dict[str, Any]] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # by tool-call index
    # Calls went out unheld before these (no guard rule could match their tool): the answer
    # still ends as tool_calls whatever is taken out of these.
    after_calls: bool = False

    def add(self, chunk: dict[str, Any]) -> None:
        self.events.append(chunk)
        for choice in chunk.get("choices") or []:
            for delta in (choice.get("delta") or {}).get("tool_calls") or []:
                call = self.calls.setdefault(
                    delta.get("index", 0),
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = delta.get("id") or call["id"]
                function = delta.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""

    def message(self) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [self.calls[i] for i in sorted(self.calls)],
        }

    def without(self, verdict: Verdict | None) -> list[bytes]:
        """The held events with the recall calls and those the guard denied taken out (and
        its text in their place), ready to forward."""
        theirs = [i for i in sorted(self.calls) if self.calls[i]["function"]["name"] != TOOL]
        dropped = set(self.calls) - set(theirs)
        if verdict is not None:
            dropped |= {theirs[p] for p in verdict.denied if p < len(theirs)}
        left = self.after_calls or len(self.calls) > len(dropped)
        out = []
        if verdict is not None and self.events:
            said = {k: v for k, v in self.events[0].items() if k not in ("choices", "usage")}
            text = {"role": "assistant", "content": verdict.text}
            said["choices"] = [{"index": 0, "delta": text, "finish_reason": None}]
            out.append(b"data: " + orjson.dumps(said) + b"\n\n")
        for chunk in self.events:
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if "tool_calls" in delta:
                    kept = [d for d in delta["tool_calls"] if d.get("index", 0) not in dropped]
                    if kept:
                        delta["tool_calls"] = kept
                    else:
                        del delta["tool_calls"]
                if choice.get("finish_reason") == "tool_calls" and not left:
                    choice["finish_reason"] = "stop"
            out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
        return out


PIECES = ("content", "reasoning_content", "reasoning")  # a delta's text, by provider


class Relay(StreamRelay):
    """Writes one response stream to the client, over one or more upstream streams (the
    recall rounds), and ends it: with [DONE], or with an error event once bytes went out
    (the openai SDK raises it as an APIError)."""

    error_prefix = b"data: "
    # A content piece (the opening chunk's content is empty), tool call arguments, reasoning.
    token_marks = (b'"content"', b'"arguments"', b'"reasoning')

    def carries_token(self, data: dict[str, Any]) -> bool:
        for choice in data.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            if any(nonempty(delta.get(key)) for key in PIECES):
                return True
            for call in delta.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and nonempty(function.get("arguments")):
                    return True
        return False

    async def release(self, held: HeldCalls, verdict: Verdict | None) -> None:
        """The held events, without the proxy's own calls and the denied ones, and the end
        of the stream."""
        await self.write(b"".join(held.without(verdict)) + DONE)

    def error_data(self, error: ProxyError | UpstreamHTTPError) -> bytes:
        if isinstance(error, UpstreamHTTPError):
            return passthrough_body(error, self.ex.identity.request_id)
        return super().error_data(error)

    async def _relay(self, source: UpstreamStream) -> HeldCalls | None:
        ex, done, held = self.ex, False, None
        passed_calls = False  # a call went out unheld
        async for batch in self.batches(source):
            out = bytearray()
            for event in batch:
                if not event.startswith(b"data:"):
                    out += event + b"\n\n"
                    continue
                payload = event[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    if held is None:
                        out += event + b"\n\n"
                    continue
                chunk = self._inspect(payload, held is not None)
                if chunk is False:
                    continue
                if chunk is not None and (held is not None or self._holds(chunk)):
                    held = held or HeldCalls(after_calls=passed_calls)
                    held.add(chunk)
                    continue
                if chunk is not None and not passed_calls:
                    passed_calls = _has_tool_calls(chunk)
                out += event + b"\n\n"
            if out:
                await self.write(bytes(out))
        if not done:
            raise UpstreamBadResponse(
                f"the upstream for '{ex.alias}' ended the stream before 'data: [DONE]'"
            )
        return held

    def _inspect(self, payload: bytes, holding: bool) -> dict[str, Any] | Literal[False] | None:
        """The parsed chunk when tool calls are watched for or it carries usage, None when it
        needs no parsing, False to drop it. Every chunk gets a cheap shape check."""
        if not is_json_object(payload):
            raise UpstreamBadResponse(
                f"the upstream for '{self.ex.alias}' sent a stream event that is not a JSON "
                f"object: {payload[:60]!r}"
            )
        has_usage = b'"usage"' in payload and b'"usage":null' not in payload
        watched = (
            holding
            or self.hold_tool_calls
            or (self.watch_tool is not None and b'"tool_calls"' in payload)
        )
        if not has_usage and not watched:
            return None
        try:
            chunk: dict[str, Any] = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise UpstreamBadResponse(
                f"the upstream for '{self.ex.alias}' sent a stream event that is not JSON: "
                f"{payload[:60]!r}"
            ) from None
        usage = Usage.of(chunk.get("usage"))
        if usage is not None:
            self.usage_reported = True
            self.ex.add_usage(usage)
            if not self.ex.client.wants_usage and not chunk.get("choices"):
                return False
        return chunk

    def _holds(self, chunk: dict[str, Any]) -> bool:
        """The chunk begins what must be held: any call when recall was offered, a call of a
        tool a guard rule could match (its name comes in the call's first chunk)."""
        if self.hold_tool_calls:
            return _has_tool_calls(chunk)
        watch = self.watch_tool
        if watch is None:
            return False
        for choice in chunk.get("choices") or ():
            for call in (choice.get("delta") or {}).get("tool_calls") or ():
                name = (call.get("function") or {}).get("name")
                if isinstance(name, str) and name and watch(name):
                    return True
        return False


def _has_tool_calls(chunk: dict[str, Any]) -> bool:
    return any((c.get("delta") or {}).get("tool_calls") for c in chunk.get("choices") or [])
