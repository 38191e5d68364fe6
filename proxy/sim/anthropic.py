"""The Anthropic Messages API twin: its checks, error shape and SSE event sequence.

It refuses what the real API refuses, with the same texts: a broken tool_use/tool_result
pairing, a thinking block whose signature does not match (thinking.py), more than four
cache_control breakpoints (prompt_cache.py), `role: "system"` messages without the
mid-conversation beta, a prompt over the window. Requests are converted to the OpenAI chat shape
so the same scripted model answers both wire formats.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import orjson

from . import context_management
from .model import (
    CHARS_4,
    JSON,
    Reply,
    Tokenizer,
    completion_tokens,
    estimate_prompt_tokens,
    request_digest,
    text_of,
)
from .prompt_cache import PromptCache, check_breakpoints
from .thinking import (
    Signer,
    ThinkingBlock,
    ThinkingSetting,
    check_thinking_blocks,
    check_tool_loop_thinking,
    reasoning_for,
    thinking_setting,
    wants_redacted,
)
from .wire import ApiError, Dialect, Event, Meta, fragments, split_words

RATE_LIMIT_REQUESTS = 4000
MID_CONVERSATION_BETA = "mid-conversation-"
_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_ERROR_MESSAGES = {
    400: "Invalid request.",
    401: "invalid x-api-key",
    403: "Your API key does not have permission to use the specified resource.",
    413: "Request exceeds the maximum allowed number of bytes.",
    429: "Number of requests has exceeded your per-minute rate limit "
    "(https://docs.anthropic.com/en/api/rate-limits); see the response headers for current usage.",
    500: "Internal server error",
    529: "Overloaded",
}


def _blocks(message: JSON) -> list[JSON]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def betas(headers: Mapping[str, str]) -> list[str]:
    """The betas an `anthropic-beta` header lists (comma-separated)."""
    listed = headers.get("anthropic-beta") or ""
    return [name.strip() for name in listed.split(",") if name.strip()]


def allows_system_messages(headers: Mapping[str, str]) -> bool:
    """`role: "system"` inside messages needs a mid-conversation beta, as Claude Code sends
    (e.g. mid-conversation-tool-changes-2026-07-01); without one the API refuses the role."""
    return any(name.startswith(MID_CONVERSATION_BETA) for name in betas(headers))


def _check_system_message(i: int, message: JSON) -> ApiError | None:
    if i == 0:
        return ApiError(
            400,
            "messages.0: use the top-level `system` parameter for the initial system prompt",
        )
    content = message.get("content")
    if isinstance(content, list) and any(
        not isinstance(b, dict) or b.get("type") != "text" for b in content
    ):
        return ApiError(
            400,
            f"messages.{i}.content: text-only role `system` messages require every content "
            "block to be of type `text`",
        )
    return None


def check_shape(
    body: JSON, headers: Mapping[str, str], *, needs_max_tokens: bool = True
) -> ApiError | None:
    if needs_max_tokens and "max_tokens" not in body:
        return ApiError(400, "max_tokens: Field required")
    messages = body.get("messages")
    if messages is None:
        return ApiError(400, "messages: Field required")
    if not isinstance(messages, list) or not messages:
        return ApiError(400, "messages: at least one message is required")
    system_ok = allows_system_messages(headers)
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "system" and system_ok:
            if error := _check_system_message(i, message):
                return error
        elif role not in ("user", "assistant"):
            return ApiError(400, f"messages.{i}.role: Input should be 'user' or 'assistant'")
    setting = thinking_setting(body)
    return setting if isinstance(setting, ApiError) else None


def check_tool_pairing(messages: list[JSON]) -> ApiError | None:
    """Each tool_use is answered by a tool_result in the very next message, and vice versa."""
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            asked = [b.get("id") for b in _blocks(message) if b.get("type") == "tool_use"]
            following = _blocks(messages[i + 1]) if i + 1 < len(messages) else []
            answered = {b.get("tool_use_id") for b in following if b.get("type") == "tool_result"}
            missing = [str(call_id) for call_id in asked if call_id not in answered]
            if missing:
                return ApiError(
                    400,
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have "
                    "a corresponding `tool_result` block in the next message.",
                )
            continue
        previous = _blocks(messages[i - 1]) if i > 0 else []
        asked_before = {b.get("id") for b in previous if b.get("type") == "tool_use"}
        for k, block in enumerate(_blocks(message)):
            if block.get("type") == "tool_result" and block.get("tool_use_id") not in asked_before:
                return ApiError(
                    400,
                    f"messages.{i}.content.{k}: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {block.get('tool_use_id')}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message.",
                )
    return None


def _chat_messages(message: JSON) -> list[JSON]:
    """One Anthropic message as OpenAI chat messages (tool results become role "tool")."""
    if message["role"] == "system":
        return [{"role": "system", "content": text_of(message.get("content"))}]
    if not isinstance(message.get("content"), list):
        return [{"role": message["role"], "content": text_of(message.get("content"))}]
    blocks = _blocks(message)
    if message["role"] == "assistant":
        calls = [
            {
                "id": b.get("id"),
                "type": "function",
                "function": {
                    "name": b.get("name"),
                    "arguments": orjson.dumps(b.get("input", {})).decode(),
                },
            }
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        chat: JSON = {"role": "assistant", "content": text_of(blocks) or None}
        return [chat | {"tool_calls": calls}] if calls else [chat]
    results = [
        {"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": text_of(b.get("content"))}
        for b in blocks
        if b.get("type") == "tool_result"
    ]
    text = text_of([b for b in blocks if b.get("type") == "text"])
    return results + ([{"role": "user", "content": text}] if text or not results else [])


def _chat_tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"any": "required", "none": "none", "auto": "auto"}.get(str(kind))


def to_chat(body: JSON) -> JSON:
    messages: list[JSON] = []
    if body.get("system"):
        messages.append({"role": "system", "content": text_of(body["system"])})
    for message in body["messages"]:
        messages.extend(_chat_messages(message))
    chat: JSON = {
        "model": body.get("model"),
        "messages": messages,
        "max_tokens": body.get("max_tokens"),
    }
    tools = [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool.get("description", ""),
                "parameters": tool.get("input_schema", {}),
            },
        }
        for tool in body.get("tools") or []
        if isinstance(tool, dict) and "name" in tool
    ]
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if (chat_choice := _chat_tool_choice(choice)) is not None:
        chat["tool_choice"] = chat_choice
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False
    return chat


def _tool_use_id(call_id: str) -> str:
    # The scripted model mints OpenAI-style ids; give them Anthropic's prefix on this wire.
    return "toolu_" + call_id.removeprefix("call_") if call_id.startswith("call_") else call_id


def _tool_input(arguments: str) -> Any:
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}


def _usage(meta: Meta, output_tokens: int) -> JSON:
    cached = meta.cache_read_tokens + meta.cache_creation_tokens
    return {
        "input_tokens": meta.prompt_tokens - cached,
        "cache_creation_input_tokens": meta.cache_creation_tokens,
        "cache_read_input_tokens": meta.cache_read_tokens,
        "output_tokens": output_tokens,
    }


def count_prompt_tokens(body: JSON, tokenizer: Tokenizer = CHARS_4) -> int:
    """The prompt tokens of an Anthropic body, as the scripted model counts them."""
    return estimate_prompt_tokens(to_chat(body), tokenizer)


def _thinking_of(meta: Meta) -> ThinkingBlock | None:
    return meta.extra if isinstance(meta.extra, ThinkingBlock) else None


def _event(name: str, payload: JSON, content: bool = False) -> Event:
    return Event(
        b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n", content
    )


class AnthropicDialect(Dialect):
    """Stateful, one per Simulator: it holds the secret its thinking signatures are minted
    with and the prompt cache its usage is counted against."""

    def __init__(
        self,
        *,
        secret: bytes | None = None,
        cache_min_tokens: int = 1024,
        tokenizer: Tokenizer = CHARS_4,
    ) -> None:
        self.signer = Signer(secret if secret is not None else os.urandom(32))
        self.prompt_cache = PromptCache(min_tokens=cache_min_tokens)
        self.tokenizer = tokenizer

    def count_prompt_tokens(self, body: JSON) -> int:
        return count_prompt_tokens(body, self.tokenizer)

    def check_auth(self, headers: Mapping[str, str], api_key: str) -> ApiError | None:
        scheme, _, bearer = headers.get("Authorization", "").partition(" ")
        key = headers.get("x-api-key") or (bearer.strip() if scheme.lower() == "bearer" else "")
        if not key:
            return ApiError(401, "x-api-key header is required", type="authentication_error")
        if key != api_key:
            return ApiError(401, "invalid x-api-key", type="authentication_error")
        return None

    def invalid_json(self) -> ApiError:
        return ApiError(400, "There was an error parsing the body of your request: invalid JSON.")

    def vouch(self, body: JSON) -> None:
        messages = body.get("messages")
        self.signer.vouch(messages if isinstance(messages, list) else [])

    def check_body(self, body: JSON, headers: Mapping[str, str]) -> ApiError | None:
        if error := check_shape(body, headers) or check_breakpoints(body):
            return error
        if error := context_management.check(body, betas(headers)):
            return error
        messages = body["messages"]
        if error := check_tool_pairing(messages) or check_thinking_blocks(messages, self.signer):
            return error
        setting = thinking_setting(body)
        thinking_on = isinstance(setting, ThinkingSetting) and setting.on
        return check_tool_loop_thinking(messages) if thinking_on else None

    def check_count_tokens(self, body: JSON, headers: Mapping[str, str]) -> ApiError | None:
        """/v1/messages/count_tokens: the same checks, but max_tokens is not asked for."""
        if error := check_shape(body, headers, needs_max_tokens=False) or check_breakpoints(body):
            return error
        return check_tool_pairing(body["messages"]) or check_thinking_blocks(
            body["messages"], self.signer
        )

    def annotate(self, body: JSON, chat: JSON, reply: Reply, meta: Meta) -> Meta:
        usage = self.prompt_cache.account(body, self.count_prompt_tokens)
        read = min(usage.read, meta.prompt_tokens)
        creation = min(usage.creation, meta.prompt_tokens - read)
        thinking = self._thinking(body, chat, reply)
        return dataclasses.replace(
            meta,
            completion_tokens=meta.completion_tokens + (thinking.tokens if thinking else 0),
            cache_read_tokens=read,
            cache_creation_tokens=creation,
            extra=thinking,
            context=context_management.apply(body, self.count_prompt_tokens)[1],
        )

    def _thinking(self, body: JSON, chat: JSON, reply: Reply) -> ThinkingBlock | None:
        """The signed block the answer starts with, when the request turns thinking on."""
        setting = thinking_setting(body)
        if not isinstance(setting, ThinkingSetting) or not setting.on:
            return None
        hidden = reasoning_for(reply, chat)
        seed = request_digest(chat) + hidden
        tokens = completion_tokens(Reply(hidden), self.tokenizer)
        if wants_redacted(chat):
            return ThinkingBlock("", self.signer.redacted_data(seed), tokens, redacted=True)
        shown = "" if setting.display == "omitted" else hidden
        return ThinkingBlock(shown, self.signer.sign(shown, seed), tokens)

    def to_chat(self, body: JSON) -> JSON:
        """What the model reads: the body after its context management."""
        return to_chat(context_management.apply(body, self.count_prompt_tokens)[0])

    def check_context(self, body: JSON, prompt_tokens: int, window: int) -> ApiError | None:
        # Only the prompt counts: current Claude models accept a max_tokens past the window
        # (and stop with "model_context_window_exceeded"), and litellm sends a huge default.
        if prompt_tokens <= window:
            return None
        return ApiError(400, f"prompt is too long: {prompt_tokens} tokens > {window} maximum")

    def fault_error(self, status: int, model: str) -> ApiError:
        fallback = "api_error" if status >= 500 else "invalid_request_error"
        message = _ERROR_MESSAGES.get(status, f"Simulated error (HTTP {status}).")
        if status == 404:
            message = f"model: {model}"
        return ApiError(status, message, type=_ERROR_TYPES.get(status, fallback))

    def error_body(self, error: ApiError, request_id: str) -> Any:
        return {
            "type": "error",
            "error": {"type": error.type, "message": error.message},
            "request_id": request_id,
        }

    def headers(self, request_id: str, processing_ms: int, status: int) -> dict[str, str]:
        remaining = 0 if status == 429 else RATE_LIMIT_REQUESTS - 1
        return {
            "request-id": request_id,
            "anthropic-organization-id": "org-sim",
            "anthropic-ratelimit-requests-limit": str(RATE_LIMIT_REQUESTS),
            "anthropic-ratelimit-requests-remaining": str(remaining),
        }

    def render(self, reply: Reply, meta: Meta) -> JSON:
        thinking = _thinking_of(meta)
        content: list[JSON] = [thinking.wire()] if thinking else []
        if reply.content or not reply.tool_calls:
            content.append({"type": "text", "text": reply.content or ""})
        for call in reply.tool_calls:
            content.append(
                {
                    "type": "tool_use",
                    "id": _tool_use_id(call.id),
                    "name": call.name,
                    "input": _tool_input(call.arguments),
                }
            )
        message = {
            "id": meta.id,
            "type": "message",
            "role": "assistant",
            "model": meta.model,
            "content": content,
            "stop_reason": _STOP_REASONS.get(reply.finish_reason, "end_turn"),
            "stop_sequence": None,
            "usage": _usage(meta, meta.completion_tokens),
        }
        return context_management.report(message, meta.context)

    def stream_events(
        self, reply: Reply, meta: Meta, words_per_chunk: int, include_usage: bool
    ) -> list[Event]:
        start = self.render(Reply(None), meta) | {
            "content": [],
            "stop_reason": None,
            "usage": _usage(meta, 1),
        }
        start.pop("context_management", None)
        events = [_event("message_start", {"type": "message_start", "message": start})]
        events.append(_event("ping", {"type": "ping"}))
        index = 0
        applied = meta.context
        if applied is not None and applied.compaction is not None:  # first, in one delta
            delta = {"type": "compaction_delta", "content": applied.compaction}
            events += _block_events(index, {"type": "compaction", "content": None}, [delta])
            index += 1
        if thinking := _thinking_of(meta):
            events += _thinking_events(thinking, words_per_chunk, index)
            index += 1
        if reply.content or not reply.tool_calls:
            pieces = [
                {"type": "text_delta", "text": p}
                for p in split_words(reply.content or "", words_per_chunk)
            ]
            events += _block_events(index, {"type": "text", "text": ""}, pieces)
            index += 1
        for call in reply.tool_calls:
            block = {
                "type": "tool_use",
                "id": _tool_use_id(call.id),
                "name": call.name,
                "input": {},
            }
            pieces = [
                {"type": "input_json_delta", "partial_json": p} for p in fragments(call.arguments)
            ]
            events += _block_events(index, block, pieces)
            index += 1
        stop = {"stop_reason": _STOP_REASONS.get(reply.finish_reason, "end_turn")}
        delta = {
            "type": "message_delta",
            "delta": stop | {"stop_sequence": None},
            "usage": _usage(meta, meta.completion_tokens),
        }
        if applied is not None and applied.requested:
            delta["context_management"] = {"applied_edits": applied.edits}
        events.append(_event("message_delta", delta))
        events.append(_event("message_stop", {"type": "message_stop"}))
        return events

    def garbage_event(self, meta: Meta) -> bytes:
        return b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"del\n\n'


def _thinking_events(thinking: ThinkingBlock, words_per_chunk: int, index: int = 0) -> list[Event]:
    """Block 0: the thinking text in thinking_delta pieces, then one signature_delta (a
    redacted block arrives whole, with no deltas)."""
    if thinking.redacted:
        return _block_events(index, thinking.wire(), [])
    pieces: list[JSON] = [
        {"type": "thinking_delta", "thinking": p}
        for p in split_words(thinking.thinking, words_per_chunk)
    ]
    signature = {"type": "signature_delta", "signature": thinking.signature}
    start = {"type": "thinking", "thinking": "", "signature": ""}
    return _block_events(index, start, pieces, [signature])


def _block_events(
    index: int, block: JSON, deltas: list[JSON], closing: list[JSON] | None = None
) -> list[Event]:
    """A content block's events; `deltas` are content pieces, `closing` deltas are not."""
    events = [
        _event(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": block},
        )
    ]
    for delta in deltas:
        payload = {"type": "content_block_delta", "index": index, "delta": delta}
        events.append(_event("content_block_delta", payload, content=True))
    for delta in closing or []:
        payload = {"type": "content_block_delta", "index": index, "delta": delta}
        events.append(_event("content_block_delta", payload))
    events.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events
