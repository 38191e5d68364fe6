"""The Gemini API twin (Google AI Studio's generateContent): its checks, error shape and SSE
chunks.

It refuses what the real API refuses, with the same texts: no contents, an empty parts list, a
function call turn whose responses do not match its calls in number, a prompt over the window,
a missing or wrong key. The model and whether to stream come from the URL
(`models/{model}:generateContent` or `:streamGenerateContent?alt=sse`); the simulator adds
them to the body it answers as `model` and `stream`. Function calls come without ids, as AI
Studio sends them, the first with a `thoughtSignature` a client must send back as it came.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from .model import CHARS_4, JSON, Reply, Tokenizer, estimate_prompt_tokens
from .prefix_cache import PrefixCache
from .wire import ApiError, Dialect, Event, Meta, split_words

_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_MESSAGES = {
    429: "Resource has been exhausted (e.g. check quota).",
    500: "An internal error has occurred. Please retry or report in "
    "https://developers.generativeai.google/guide/troubleshooting",
    503: "The model is overloaded. Please try again later.",
}
_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}
BAD_KEY = "API key not valid. Please pass a valid API key."
NO_KEY = (
    "Method doesn't allow unregistered callers (callers without established identity). "
    "Please use API Key or other form of API consumer identity to call this API."
)
RESPONSE_COUNT = (
    "Please ensure that the number of function response parts is equal to the number of "
    "function call parts of the function call turn."
)
CALL_PLACE = (
    "Please ensure that function call turn comes immediately after a user turn or after a "
    "function response turn."
)


def _get(obj: Any, camel: str, snake: str) -> Any:
    if not isinstance(obj, dict):
        return None
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def _parts(content: Any) -> list[JSON]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def _calls(content: Any) -> list[JSON]:
    return [
        c
        for p in _parts(content)
        if isinstance(c := _get(p, "functionCall", "function_call"), dict)
    ]


def _responses(content: Any) -> list[JSON]:
    return [
        r
        for p in _parts(content)
        if isinstance(r := _get(p, "functionResponse", "function_response"), dict)
    ]


def call_id(model: str, index: int, k: int) -> str:
    """The chat id the twin gives the k-th call of the index-th content (ids are not sent)."""
    return f"call_g{index}_{k}"


def signature(name: str, args: Any) -> str:
    """The opaque signature the twin puts on a function call part."""
    digest = hashlib.sha256(orjson.dumps([name, args], option=orjson.OPT_SORT_KEYS))
    return "c2lt" + digest.hexdigest()[:32]


def check_contents(body: JSON) -> ApiError | None:
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return ApiError(400, "* GenerateContentRequest.contents: contents is not specified\n")
    for i, content in enumerate(contents):
        if not isinstance(content, dict) or not _parts(content):
            return ApiError(
                400, f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not "
                "be empty.\n"
            )  # fmt: skip
    for i, content in enumerate(contents):
        calls = _calls(content)
        if not calls or content.get("role") != "model":
            continue
        before = contents[i - 1] if i else None
        if before is None or before.get("role") == "model":
            return ApiError(400, CALL_PLACE)
        after = contents[i + 1] if i + 1 < len(contents) else None
        if after is not None and len(_responses(after)) != len(calls):
            return ApiError(400, RESPONSE_COUNT)
    return None


def to_chat(body: JSON) -> JSON:
    """The chat-shaped body the scripted model answers (calls named by their place)."""
    messages: list[JSON] = []
    system = _get(body, "systemInstruction", "system_instruction")
    if system:
        text = system if isinstance(system, str) else _text(_parts(system))
        messages.append({"role": "system", "content": text})
    open_calls: list[tuple[str, str]] = []
    for i, content in enumerate(body.get("contents") or []):
        parts = _parts(content)
        if content.get("role") == "model":
            calls: list[JSON] = [
                {
                    "id": call_id("", i, k),
                    "type": "function",
                    "function": {
                        "name": call.get("name"),
                        "arguments": orjson.dumps(call.get("args") or {}).decode(),
                    },
                }
                for k, call in enumerate(_calls(content))
            ]
            open_calls = [(str(c["id"]), str(c["function"]["name"])) for c in calls]
            message: JSON = {"role": "assistant", "content": _text(parts) or None}
            if calls:
                message["tool_calls"] = calls
            messages.append(message)
            continue
        for response in _responses(content):
            found = next((c for c in open_calls if c[1] == response.get("name")), None)
            match = found or (open_calls[0] if open_calls else ("orphan", ""))
            if match in open_calls:
                open_calls.remove(match)
            output = response.get("response")
            said = output.get("output") if isinstance(output, dict) else None
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": match[0],
                    "content": said if isinstance(said, str) else orjson.dumps(output).decode(),
                }
            )
        text = _text(parts)
        if text or not _responses(content):
            messages.append({"role": "user", "content": text})
    chat: JSON = {"model": body.get("model"), "messages": messages}
    tools = [
        {
            "type": "function",
            "function": {
                "name": d.get("name"),
                "parameters": _lower(
                    _get(d, "parametersJsonSchema", "parameters_json_schema")
                    or d.get("parameters")
                    or {"type": "object"}
                ),
            },
        }
        for tool in body.get("tools") or []
        for d in _get(tool, "functionDeclarations", "function_declarations") or []
        if isinstance(d, dict)
    ]
    if tools:
        chat["tools"] = tools
    config = _get(body, "generationConfig", "generation_config") or {}
    limit = _get(config, "maxOutputTokens", "max_output_tokens")
    if isinstance(limit, int):
        chat["max_tokens"] = limit
    schema = _get(config, "responseJsonSchema", "response_json_schema") or _get(
        config, "responseSchema", "response_schema"
    )
    if isinstance(schema, dict):  # JSON by a schema: the model answers in it
        chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": _lower(schema)}}
    calling = _get(_get(body, "toolConfig", "tool_config"), "functionCallingConfig",
                   "function_calling_config")  # fmt: skip
    mode = calling.get("mode") if isinstance(calling, dict) else None
    if mode in ("NONE", "ANY"):
        chat["tool_choice"] = "none" if mode == "NONE" else "required"
    return chat


def _text(parts: list[JSON]) -> str:
    return "".join(
        p["text"] for p in parts if isinstance(p.get("text"), str) and p.get("thought") is not True
    )


def _lower(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _lower(v) for k, v in schema.items()}
        if isinstance(out.get("type"), str):
            out["type"] = out["type"].lower()
        return out
    if isinstance(schema, list):
        return [_lower(v) for v in schema]
    return schema


def usage_metadata(meta: Meta) -> JSON:
    usage: JSON = {
        "promptTokenCount": meta.prompt_tokens,
        "candidatesTokenCount": meta.completion_tokens,
        "totalTokenCount": meta.prompt_tokens + meta.completion_tokens,
    }
    if meta.cache_read_tokens:
        usage["cachedContentTokenCount"] = meta.cache_read_tokens
    return usage


class GeminiDialect(Dialect):
    def __init__(self, *, cache_min_tokens: int = 1024, tokenizer: Tokenizer = CHARS_4) -> None:
        self.prompt_cache = PrefixCache(min_tokens=cache_min_tokens)
        self.tokenizer = tokenizer

    def annotate(self, body: JSON, chat: JSON, reply: Reply, meta: Meta) -> Meta:
        """Implicit caching, as Gemini 2.5 does: a repeated prefix is read from the cache."""
        messages = chat["messages"]
        cached = self.prompt_cache.account(
            [chat.get("model")],
            chat.get("tools"),
            messages,
            lambda n: estimate_prompt_tokens(chat | {"messages": messages[:n]}, self.tokenizer),
        )
        return dataclasses.replace(meta, cache_read_tokens=min(cached, meta.prompt_tokens))

    def check_auth(self, headers: Mapping[str, str], api_key: str) -> ApiError | None:
        key = headers.get("x-goog-api-key")
        if not key:
            return ApiError(403, NO_KEY)
        if key != api_key:
            return ApiError(400, BAD_KEY)
        return None

    def invalid_json(self) -> ApiError:
        return ApiError(400, "Invalid JSON payload received.")

    def check_body(self, body: JSON, headers: Mapping[str, str]) -> ApiError | None:
        return check_contents(body)

    def to_chat(self, body: JSON) -> JSON:
        return to_chat(body)

    def count_prompt_tokens(self, body: JSON) -> int:
        return estimate_prompt_tokens(to_chat(body), self.tokenizer)

    def check_context(self, body: JSON, prompt_tokens: int, window: int) -> ApiError | None:
        if prompt_tokens > window:
            return ApiError(
                400,
                f"The input token count ({prompt_tokens}) exceeds the maximum number of tokens "
                f"allowed ({window}).",
            )
        return None

    def fault_error(self, status: int, model: str) -> ApiError:
        message = _MESSAGES.get(status, f"Simulated error (HTTP {status}).")
        if status == 404:
            message = f"models/{model} is not found for API version v1beta"
        return ApiError(status, message)

    def error_body(self, error: ApiError, request_id: str) -> Any:
        status = _STATUSES.get(error.status) or ("INTERNAL" if error.status >= 500 else "UNKNOWN")
        return {"error": {"code": error.status, "message": error.message, "status": status}}

    def headers(self, request_id: str, processing_ms: int, status: int) -> dict[str, str]:
        return {"server-timing": f"gfet4t7; dur={processing_ms}", "x-sim-request-id": request_id}

    def _parts(self, reply: Reply) -> list[JSON]:
        parts: list[JSON] = []
        if reply.content or not reply.tool_calls:
            parts.append({"text": reply.content or ""})
        for k, call in enumerate(reply.tool_calls):
            args = orjson.loads(call.arguments or "{}")
            part: JSON = {"functionCall": {"name": call.name, "args": args}}
            if k == 0:
                part["thoughtSignature"] = signature(call.name, args)
            parts.append(part)
        return parts

    def _chunk(self, parts: list[JSON], meta: Meta, finish: str | None) -> JSON:
        candidate: JSON = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish is not None:
            candidate["finishReason"] = finish
        return {
            "candidates": [candidate],
            "usageMetadata": usage_metadata(meta),
            "modelVersion": meta.model,
            "responseId": meta.id,
        }

    def render(self, reply: Reply, meta: Meta) -> JSON:
        return self._chunk(self._parts(reply), meta, _FINISH.get(reply.finish_reason, "STOP"))

    def stream_events(
        self, reply: Reply, meta: Meta, words_per_chunk: int, include_usage: bool
    ) -> list[Event]:
        """Text in pieces of words, then the calls whole with the finish reason; every chunk
        with the usage so far (the prompt's from the first)."""
        finish = _FINISH.get(reply.finish_reason, "STOP")
        pieces = split_words(reply.content or "", words_per_chunk)
        calls = [p for p in self._parts(reply) if "functionCall" in p]
        events: list[Event] = []
        for number, piece in enumerate(pieces):
            last = number == len(pieces) - 1 and not calls
            chunk = self._chunk([{"text": piece}], meta, finish if last else None)
            events.append(Event(_sse(chunk), content=True))
        if calls or not events:
            events.append(Event(_sse(self._chunk(calls or [{"text": ""}], meta, finish)), True))
        return events

    def garbage_event(self, meta: Meta) -> bytes:
        return b'data: {"candidates": [{"content": {"parts": [{"tex\n\n'


def _sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\r\n\r\n"
