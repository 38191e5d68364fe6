"""What the simulator's wire dialects (OpenAI chat, OpenAI Responses, Anthropic) share."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .model import JSON, Reply

ARGUMENT_FRAGMENT_CHARS = 8  # tool arguments stream in pieces this long, like tokens would


@dataclass(frozen=True)
class ApiError:
    """An error answer; `type` is the dialect's own error type string."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | int | None = None


@dataclass(frozen=True)
class Event:
    """One server-sent event, ready to write; `content` marks text/argument pieces."""

    data: bytes
    content: bool = False


@dataclass(frozen=True)
class Meta:
    """The per-response facts a rendering needs besides the reply itself."""

    id: str
    created: int
    model: str
    prompt_tokens: int  # the whole prompt, cached parts included
    completion_tokens: int
    cache_read_tokens: int = 0  # of prompt_tokens, read from the prompt cache
    cache_creation_tokens: int = 0  # of prompt_tokens, written to the prompt cache
    extra: Any = None  # what only one dialect renders (Anthropic: the thinking block)
    context: Any = None  # Anthropic: what the request's context_management did


class Dialect(ABC):
    """A wire format: how requests are checked and how replies and errors are rendered."""

    @abstractmethod
    def check_auth(self, headers: Mapping[str, str], api_key: str) -> ApiError | None: ...

    @abstractmethod
    def invalid_json(self) -> ApiError: ...

    @abstractmethod
    def check_body(self, body: JSON, headers: Mapping[str, str]) -> ApiError | None:
        """Shape and tool-pairing checks, in the order the real API applies them."""

    @abstractmethod
    def to_chat(self, body: JSON) -> JSON:
        """The OpenAI-shaped chat body the scripted model and token estimate work on."""

    @abstractmethod
    def check_context(self, body: JSON, prompt_tokens: int, window: int) -> ApiError | None: ...

    def vouch(self, body: JSON) -> None:
        """Take the signed items of a request another API answered (thinking signatures,
        sealed reasoning: a recorded session replayed) as minted here, exactly as they are.
        A dialect that signs nothing has nothing to take."""
        return None

    def stream_failure(self, body: JSON, error: ApiError, meta: Meta) -> list[Event] | None:
        """The events telling a streamed request of `error` inside a 200 stream, where the API
        does that (Responses: `response.failed`); None answers with the HTTP error."""
        return None

    def annotate(self, body: JSON, chat: JSON, reply: Reply, meta: Meta) -> Meta:
        """The answer's facts beyond the scripted reply (prompt cache, reasoning); called once
        per answered request, so it may update the dialect's state."""
        return meta

    @abstractmethod
    def fault_error(self, status: int, model: str) -> ApiError:
        """The error body this API typically sends with `status`."""

    @abstractmethod
    def error_body(self, error: ApiError, request_id: str) -> Any: ...

    @abstractmethod
    def headers(self, request_id: str, processing_ms: int, status: int) -> dict[str, str]: ...

    @abstractmethod
    def render(self, reply: Reply, meta: Meta) -> JSON: ...

    @abstractmethod
    def stream_events(
        self, reply: Reply, meta: Meta, words_per_chunk: int, include_usage: bool
    ) -> list[Event]:
        """The whole event sequence; the first event is the opening (role / message_start)."""

    @abstractmethod
    def garbage_event(self, meta: Meta) -> bytes:
        """A syntactically broken event, for Fault(malformed=True) on streams."""


def sse_data(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def split_words(text: str, words_per_chunk: int) -> list[str]:
    """Pieces of `words_per_chunk` words each; joined back they give the text exactly."""
    words = re.findall(r"\s*\S+\s*", text) or ([text] if text else [])
    size = max(1, words_per_chunk)
    return ["".join(words[i : i + size]) for i in range(0, len(words), size)]


def fragments(arguments: str) -> list[str]:
    size = ARGUMENT_FRAGMENT_CHARS
    return [arguments[i : i + size] for i in range(0, len(arguments), size)] or [""]
