"""A streamed Anthropic message assembled into the message it stands for (what a recording
keeps as the answer)."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.recording.answers import Texts


class AnthropicAnswer:
    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self.partial: dict[int, list[str]] = {}
        self.texts = Texts()

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        message = self.message
        if kind == "message_start":
            self.message = dict(event.get("message") or {})
            self.message["content"] = list(self.message.get("content") or [])
            self.partial.clear()
            self.texts = Texts()
        elif message is None:
            return
        elif kind == "content_block_start":
            index = event.get("index", len(message["content"]))
            while len(message["content"]) <= index:
                message["content"].append({})
            message["content"][index] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            index = event.get("index", 0)
            if index >= len(message["content"]):
                return
            block, delta = message["content"][index], event.get("delta") or {}
            for name in ("text", "thinking", "signature"):
                if isinstance(delta.get(name), str):
                    self.texts.append(block, name, delta[name])
            if "partial_json" in delta:
                self.partial.setdefault(index, []).append(delta["partial_json"])
        elif kind == "message_delta":
            message.update(event.get("delta") or {})
            if isinstance(event.get("usage"), dict):
                message["usage"] = {**(message.get("usage") or {}), **event["usage"]}
        elif kind == "error":
            message["error"] = event.get("error")

    def answer(self) -> dict[str, Any] | None:
        message = self.message
        if message is None:
            return None
        self.texts.join()
        for index, pieces in self.partial.items():
            text = "".join(pieces)
            try:
                message["content"][index]["input"] = orjson.loads(text) if text else {}
            except orjson.JSONDecodeError:
                message["content"][index]["input"] = text
        return message
