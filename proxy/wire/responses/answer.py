"""A streamed Responses answer: the last `response` its events carried (created, in_progress,
then completed), with a later error event's error (what a recording keeps as the answer)."""

from __future__ import annotations

from typing import Any


class ResponsesAnswer:
    def __init__(self) -> None:
        self.last: dict[str, Any] | None = None

    def add(self, event: dict[str, Any]) -> None:
        response = event.get("response")
        if isinstance(response, dict):
            self.last = response  # created, in_progress, then completed: the final one wins
        elif event.get("type") == "error" and self.last is not None:
            self.last = {**self.last, "error": event.get("error") or event}

    def answer(self) -> dict[str, Any] | None:
        return self.last
