"""An answer as its client got it, in the wire's non-streamed shape: a JSON body as it is, a
stream (the bytes the relay wrote) assembled into the reply it stands for. Reads plain parsed
events; imports no wire format."""

from __future__ import annotations

from typing import Any

import orjson


def answer_of(wire: str, body: bytes | None, streamed: list[bytes] | None) -> Any:
    """The answer's native non-streamed form, or None when there was none to read."""
    if streamed:
        return assembled(wire, _events(b"".join(streamed)))
    if not body:
        return None
    if body.lstrip()[:1] in (b"{", b"["):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
    return assembled(wire, _events(body))  # a whole answer sent as its wire's event stream


def assembled(wire: str, events: list[dict[str, Any]]) -> dict[str, Any] | None:
    if wire == "anthropic":
        return _anthropic(events)
    if wire == "responses":
        return _responses(events)
    return _chat(events)


def _events(data: bytes) -> list[dict[str, Any]]:
    """Each SSE event's JSON data (`[DONE]` and anything unparsable skipped)."""
    out: list[dict[str, Any]] = []
    for block in data.split(b"\n\n"):
        payload = b"\n".join(
            line[5:].lstrip() for line in block.split(b"\n") if line.startswith(b"data:")
        )
        if not payload or payload == b"[DONE]":
            continue
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def _chat(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not events:
        return None
    first = events[0]
    answer: dict[str, Any] = {
        "id": first.get("id"),
        "object": "chat.completion",
        "created": first.get("created"),
        "model": first.get("model"),
        "choices": [],
    }
    choices: dict[int, dict[str, Any]] = {}
    for event in events:
        if isinstance(event.get("usage"), dict):
            answer["usage"] = event["usage"]
        if "error" in event:
            answer["error"] = event["error"]
        for choice in event.get("choices") or ():
            index = choice.get("index", 0)
            into = choices.setdefault(
                index,
                {"index": index, "message": {"role": "assistant", "content": None},
                 "finish_reason": None},
            )  # fmt: skip
            _chat_delta(into["message"], choice.get("delta") or {})
            if choice.get("finish_reason") is not None:
                into["finish_reason"] = choice["finish_reason"]
    answer["choices"] = [choices[i] for i in sorted(choices)]
    return answer


def _chat_delta(message: dict[str, Any], delta: dict[str, Any]) -> None:
    for name, value in delta.items():
        if name == "tool_calls":
            calls = message.setdefault("tool_calls", [])
            for piece in value or ():
                index = piece.get("index", len(calls))
                while len(calls) <= index:
                    calls.append({"id": None, "type": "function",
                                  "function": {"name": "", "arguments": ""}})  # fmt: skip
                call = calls[index]
                if piece.get("id"):
                    call["id"] = piece["id"]
                function = piece.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
        elif isinstance(value, str) and name != "role":
            message[name] = (message.get(name) or "") + value
        elif value is not None:
            message[name] = value


def _anthropic(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    message: dict[str, Any] | None = None
    partial: dict[int, str] = {}
    for event in events:
        kind = event.get("type")
        if kind == "message_start":
            message = dict(event.get("message") or {})
            message["content"] = list(message.get("content") or [])
        elif message is None:
            continue
        elif kind == "content_block_start":
            index = event.get("index", len(message["content"]))
            while len(message["content"]) <= index:
                message["content"].append({})
            message["content"][index] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            index = event.get("index", 0)
            if index >= len(message["content"]):
                continue
            block, delta = message["content"][index], event.get("delta") or {}
            for name in ("text", "thinking", "signature"):
                if name in delta:
                    block[name] = (block.get(name) or "") + delta[name]
            if "partial_json" in delta:
                partial[index] = partial.get(index, "") + delta["partial_json"]
        elif kind == "message_delta":
            message.update(event.get("delta") or {})
            if isinstance(event.get("usage"), dict):
                message["usage"] = {**(message.get("usage") or {}), **event["usage"]}
        elif kind == "error":
            message["error"] = event.get("error")
    if message is not None:
        for index, text in partial.items():
            try:
                message["content"][index]["input"] = orjson.loads(text) if text else {}
            except orjson.JSONDecodeError:
                message["content"][index]["input"] = text
    return message


def _responses(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    last: dict[str, Any] | None = None
    for event in events:
        response = event.get("response")
        if isinstance(response, dict):
            last = response  # created, in_progress, then completed: the final one wins
        elif event.get("type") == "error" and last is not None:
            last = {**last, "error": event.get("error") or event}
    return last
