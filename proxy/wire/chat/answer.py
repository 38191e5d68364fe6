"""A streamed chat completion assembled into the `chat.completion` it stands for (what a
recording keeps as the answer)."""

from __future__ import annotations

from typing import Any

from proxy.recording.answers import Texts


class ChatAnswer:
    def __init__(self) -> None:
        self.first: dict[str, Any] | None = None
        self.usage: Any = None
        self.error: Any = None
        self.choices: dict[int, dict[str, Any]] = {}
        self.texts = Texts()

    def add(self, event: dict[str, Any]) -> None:
        if self.first is None:
            self.first = event
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        if "error" in event:
            self.error = event["error"]
        for choice in event.get("choices") or ():
            index = choice.get("index", 0)
            into = self.choices.get(index)
            if into is None:
                into = self.choices[index] = {
                    "index": index,
                    "message": {"role": "assistant", "content": None},
                    "finish_reason": None,
                }
            self._delta(into["message"], choice.get("delta") or {})
            if choice.get("finish_reason") is not None:
                into["finish_reason"] = choice["finish_reason"]

    def _delta(self, message: dict[str, Any], delta: dict[str, Any]) -> None:
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
                    for part in ("name", "arguments"):
                        if isinstance(function.get(part), str):
                            self.texts.append(call["function"], part, function[part])
            elif isinstance(value, str) and name != "role":
                self.texts.append(message, name, value)
            elif value is not None:
                self.texts.drop(message, name)
                message[name] = value

    def answer(self) -> dict[str, Any] | None:
        if self.first is None:
            return None
        self.texts.join()
        first = self.first
        answer: dict[str, Any] = {
            "id": first.get("id"),
            "object": "chat.completion",
            "created": first.get("created"),
            "model": first.get("model"),
            "choices": [self.choices[i] for i in sorted(self.choices)],
        }
        if self.usage is not None:
            answer["usage"] = self.usage
        if self.error is not None:
            answer["error"] = self.error
        return answer
