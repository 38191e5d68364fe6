"""OpenAI Chat Completions dialect: OpenAI's own checks and error texts, and its wire format."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .model import CHARS_4, JSON, Reply, Tokenizer, estimate_prompt_tokens, max_output_tokens
from .prefix_cache import PrefixCache
from .wire import ApiError, Dialect, Event, Meta, fragments, split_words, sse_data

SYSTEM_FINGERPRINT = "fp_5im0a1b2c3"
RATE_LIMIT_REQUESTS = 10000
_KEYS_URL = "https://platform.openai.com/account/api-keys"
_ROLES = ("system", "assistant", "user", "function", "tool", "developer")

NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with "
    "blank username) if you're accessing the API from your browser and are prompted for a "
    f"username and password. You can obtain an API key from {_KEYS_URL}."
)
INVALID_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
    "your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was "
    "not valid JSON. If you have trouble figuring out how to fix this, please contact us through "
    "our help center at help.openai.com.)"
)
# "preceeding" is OpenAI's spelling; clients match on this text, so keep it.
ORPHAN_TOOL = (
    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
    "with 'tool_calls'."
)
MISSING_TOOL_RESULTS = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to "
    "each 'tool_call_id'. The following tool_call_ids did not have response messages: "
)
_JSON_TYPE_NAMES = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a decimal",
    list: "an array",
    dict: "an object",
}


def mask_key(key: str) -> str:
    """Star out all but the first 3 and last 4 characters, as OpenAI echoes a wrong key."""
    if len(key) < 12:  # too short to show any of it safely
        return "*" * len(key)
    return key[:3] + "*" * (len(key) - 7) + key[-4:]


def _type_name(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), "null")


def check_messages(body: JSON) -> ApiError | None:
    messages = body.get("messages")
    if messages is None:
        return ApiError(
            400,
            "Missing required parameter: 'messages'.",
            param="messages",
            code="missing_required_parameter",
        )
    if not isinstance(messages, list):
        return ApiError(
            400,
            "Invalid type for 'messages': expected an array of objects, "
            f"but got {_type_name(messages)} instead.",
            param="messages",
            code="invalid_type",
        )
    if not messages:
        return ApiError(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            param="messages",
            code="empty_array",
        )
    for i, message in enumerate(messages):
        if error := _check_message(i, message):
            return error
    return None


def _check_message(i: int, message: Any) -> ApiError | None:
    if not isinstance(message, dict):
        return ApiError(
            400,
            f"Invalid type for 'messages[{i}]': expected an object, "
            f"but got {_type_name(message)} instead.",
            param=f"messages[{i}]",
            code="invalid_type",
        )
    if "role" not in message:
        return ApiError(
            400,
            f"Missing required parameter: 'messages[{i}].role'.",
            param=f"messages[{i}].role",
            code="missing_required_parameter",
        )
    if message["role"] not in _ROLES:
        return ApiError(
            400,
            f"Invalid value: '{message['role']}'. Supported values are: 'system', 'assistant', "
            "'user', 'function', 'tool', and 'developer'.",
            param=f"messages[{i}].role",
            code="invalid_value",
        )
    return None


def check_tool_pairing(messages: list[JSON]) -> ApiError | None:
    """Every tool_calls message is followed by one tool message per id; no tool message is
    orphaned. The param names the message where the rule broke, like OpenAI's."""
    i = 0
    while i < len(messages):
        message = messages[i]
        if message["role"] == "tool":
            return ApiError(400, ORPHAN_TOOL, param=f"messages.[{i}].role")
        calls = message.get("tool_calls") if message["role"] == "assistant" else None
        if not calls:
            i += 1
            continue
        expected = [call.get("id") for call in calls if isinstance(call, dict)]
        answered: set[Any] = set()
        i += 1
        while i < len(messages) and messages[i]["role"] == "tool":
            call_id = messages[i].get("tool_call_id")
            if call_id not in expected:
                return ApiError(
                    400,
                    f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in "
                    "'tool_calls' of previous message.",
                    param=f"messages.[{i}].tool_call_id",
                )
            answered.add(call_id)
            i += 1
        missing = [str(call_id) for call_id in expected if call_id not in answered]
        if missing:
            return ApiError(
                400, MISSING_TOOL_RESULTS + ", ".join(missing), param=f"messages.[{i}].role"
            )
    return None


def context_error(window: int, prompt: int, completion: int | None) -> ApiError:
    """OpenAI words it differently depending on whether a completion budget was requested."""
    if completion:
        message = (
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the "
            "completion). Please reduce the length of the messages or completion."
        )
    else:
        message = (
            f"This model's maximum context length is {window} tokens. However, your messages "
            f"resulted in {prompt} tokens. Please reduce the length of the messages."
        )
    return ApiError(400, message, param="messages", code="context_length_exceeded")


def usage(meta: Meta) -> JSON:
    return {
        "prompt_tokens": meta.prompt_tokens,
        "completion_tokens": meta.completion_tokens,
        "total_tokens": meta.prompt_tokens + meta.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": meta.cache_read_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _wire_tool_calls(reply: Reply) -> list[JSON]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in reply.tool_calls
    ]


class OpenAIDialect(Dialect):
    """Chat Completions. One per Simulator holds the automatic prompt cache its usage is
    counted against (by model and `prompt_cache_key`, tools first, then messages)."""

    def __init__(self, *, cache_min_tokens: int = 1024, tokenizer: Tokenizer = CHARS_4) -> None:
        self.prompt_cache = PrefixCache(min_tokens=cache_min_tokens)
        self.tokenizer = tokenizer

    def annotate(self, body: JSON, chat: JSON, reply: Reply, meta: Meta) -> Meta:
        messages = body.get("messages") or []
        cached = self.prompt_cache.account(
            [body.get("model"), body.get("prompt_cache_key")],
            body.get("tools"),
            messages,
            lambda n: estimate_prompt_tokens(body | {"messages": messages[:n]}, self.tokenizer),
        )
        return dataclasses.replace(meta, cache_read_tokens=min(cached, meta.prompt_tokens))

    def check_auth(self, headers: Mapping[str, str], api_key: str) -> ApiError | None:
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return ApiError(401, NO_KEY)
        if token != api_key:
            return ApiError(
                401,
                f"Incorrect API key provided: {mask_key(token)}. "
                f"You can find your API key at {_KEYS_URL}.",
                code="invalid_api_key",
            )
        return None

    def invalid_json(self) -> ApiError:
        return ApiError(400, INVALID_JSON)

    def check_body(self, body: JSON, headers: Mapping[str, str]) -> ApiError | None:
        if not body.get("model"):
            return ApiError(400, "you must provide a model parameter")
        return check_messages(body) or check_tool_pairing(body["messages"])

    def to_chat(self, body: JSON) -> JSON:
        return body

    def check_context(self, body: JSON, prompt_tokens: int, window: int) -> ApiError | None:
        completion = max_output_tokens(body)
        if prompt_tokens + (completion or 0) <= window:
            return None
        return context_error(window, prompt_tokens, completion)

    def fault_error(self, status: int, model: str) -> ApiError:
        return fault_error(status, model)

    def error_body(self, error: ApiError, request_id: str) -> Any:
        return {
            "error": {
                "message": error.message,
                "type": error.type,
                "param": error.param,
                "code": error.code,
            }
        }

    def headers(self, request_id: str, processing_ms: int, status: int) -> dict[str, str]:
        remaining = 0 if status == 429 else RATE_LIMIT_REQUESTS - 1
        return {
            "x-request-id": request_id,
            "openai-processing-ms": str(processing_ms),
            "openai-version": "2020-10-01",
            "openai-organization": "org-sim",
            "x-ratelimit-limit-requests": str(RATE_LIMIT_REQUESTS),
            "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": "6ms",
        }

    def render(self, reply: Reply, meta: Meta) -> JSON:
        message: JSON = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = _wire_tool_calls(reply)
        message.update(refusal=None, annotations=[])
        return {
            "id": meta.id,
            "object": "chat.completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": usage(meta),
            "service_tier": "default",
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }

    def stream_events(
        self, reply: Reply, meta: Meta, words_per_chunk: int, include_usage: bool
    ) -> list[Event]:
        def chunk(delta: JSON, finish_reason: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return sse_data(_chunk_envelope(meta, [choice], include_usage))

        text_reply = reply.content is not None or not reply.tool_calls
        opening = {"role": "assistant", "content": "" if text_reply else None, "refusal": None}
        events = [Event(chunk(opening))]
        for piece in split_words(reply.content or "", words_per_chunk):
            events.append(Event(chunk({"content": piece}), content=True))
        for index, call in enumerate(reply.tool_calls):
            head = {"index": index, "id": call.id, "type": "function"}
            head["function"] = {"name": call.name, "arguments": ""}
            events.append(Event(chunk({"tool_calls": [head]})))
            for piece in fragments(call.arguments):
                delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                events.append(Event(chunk(delta), content=True))
        events.append(Event(chunk({}, reply.finish_reason)))
        if include_usage:
            final = _chunk_envelope(meta, [], include_usage) | {"usage": usage(meta)}
            events.append(Event(sse_data(final)))
        events.append(Event(b"data: [DONE]\n\n"))
        return events

    def garbage_event(self, meta: Meta) -> bytes:
        # A chunk cut off mid-string: what a broken intermediary would hand on.
        return b'data: {"id":"' + meta.id.encode() + b'","object":"chat.completion.chunk","cho\n\n'


def _chunk_envelope(meta: Meta, choices: list[JSON], include_usage: bool) -> JSON:
    envelope: JSON = {
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "service_tier": "default",
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": choices,
    }
    if include_usage:
        envelope["usage"] = None
    return envelope


def fault_error(status: int, model: str) -> ApiError:
    """The body OpenAI typically sends with each status (texts as seen in the wild)."""
    if status == 429:
        return ApiError(
            429,
            f"Rate limit reached for {model} in organization org-sim on requests per min (RPM): "
            "Limit 60, Used 60, Requested 1. Please try again in 1s. Visit "
            "https://platform.openai.com/account/rate-limits to learn more.",
            type="requests",
            code="rate_limit_exceeded",
        )
    known = {
        400: ApiError(400, "Invalid request."),
        401: ApiError(401, NO_KEY),
        403: ApiError(
            403,
            "Country, region, or territory not supported",
            type="request_forbidden",
            code="unsupported_country_region_territory",
        ),
        404: ApiError(
            404,
            f"The model `{model}` does not exist or you do not have access to it.",
            code="model_not_found",
        ),
        500: ApiError(
            500,
            "The server had an error while processing your request. Sorry about that!",
            type="server_error",
        ),
        502: ApiError(502, "Bad gateway.", type="cf_bad_gateway", code=502),
        503: ApiError(503, "The server is overloaded or not ready yet.", type="server_error"),
        504: ApiError(504, "Gateway timeout.", type="cf_gateway_timeout", code=504),
    }
    if status in known:
        return known[status]
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return ApiError(status, f"Simulated error (HTTP {status}).", type=kind)


OPENAI = OpenAIDialect()
