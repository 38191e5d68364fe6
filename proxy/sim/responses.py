"""The OpenAI Responses API twin (`POST /v1/responses`): its checks, error shape and events.

It refuses what the real API refuses, with the same texts: a `function_call` (or
`custom_tool_call`) without its output later in the input, an output answering no call, a
chat-shaped tool (`{"type": "function", "function": {...}}`), a `previous_response_id` it did
not answer with `store` on (it remembers only the ids, not the history they name: a
continuation's calls may live there, so its pairing is not checked), a reasoning item whose
`encrypted_content` this simulator did not mint or that was changed, and an input over the
window. Replies start with a
reasoning item when the request asks for reasoning, its `encrypted_content` minted here (an
HMAC under a secret each Simulator draws) when `include` lists `reasoning.encrypted_content`.
`cached_tokens` comes from a prefix cache scoped by `prompt_cache_key`. Requests are converted
to the chat shape so the same scripted model answers every wire format.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .chat import INVALID_JSON, OPENAI
from .chat import fault_error as openai_fault_error
from .model import (
    CHARS_4,
    JSON,
    Reply,
    Tokenizer,
    completion_tokens,
    estimate_prompt_tokens,
    text_of,
)
from .prefix_cache import PrefixCache
from .thinking import reasoning_for
from .wire import ApiError, Dialect, Event, Meta, fragments, split_words

ENCRYPTED_CONTENT = "reasoning.encrypted_content"
CONTEXT_EXCEEDED = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)
ROLES = ("user", "assistant", "system", "developer")
# Input item types the API knows; anything else is refused. The chat model only reads
# messages, function and custom tool calls and their outputs; the rest is accepted and skipped.
ITEM_TYPES = (
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
    "additional_tools",
    "tool_search_call",
    "tool_search_output",
    "web_search_call",
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "image_generation_call",
    "code_interpreter_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "compaction",
    "item_reference",
)
TOOL_TYPES = (
    "function",
    "custom",
    "namespace",
    "web_search",
    "web_search_preview",
    "file_search",
    "computer_use_preview",
    "code_interpreter",
    "image_generation",
    "local_shell",
    "shell",
    "apply_patch",
    "mcp",
    "tool_search",
)
_CALL_OUTPUTS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
}
_CALL_WORDS = {"function_call": "function call", "custom_tool_call": "custom tool call"}
_CUSTOM_PARAMETERS: JSON = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
}
_ECHOED = (
    "instructions",
    "max_output_tokens",
    "parallel_tool_calls",
    "reasoning",
    "store",
    "text",
    "tool_choice",
    "tools",
    "prompt_cache_key",
)
_BLOB_PREFIX = "gAAAAA"  # what the API's encrypted_content looks like from outside (Fernet)
_BLOB_VERSION = b"\x01"
_MAC_BYTES = 32


@dataclass(frozen=True)
class ReasoningItem:
    id: str
    summary: str  # "" when no summary was asked for
    encrypted_content: str | None
    tokens: int

    def wire(self) -> JSON:
        summary = [{"type": "summary_text", "text": self.summary}] if self.summary else []
        item: JSON = {"id": self.id, "type": "reasoning", "summary": summary}
        if self.encrypted_content is not None:
            item["encrypted_content"] = self.encrypted_content
        return item


@dataclass(frozen=True)
class Echo:
    """What a Responses answer repeats from its request, and the reasoning it starts with."""

    request: JSON
    custom_tools: frozenset[str]
    reasoning: ReasoningItem | None
    namespaces: Mapping[str, str] = dataclasses.field(default_factory=dict)  # tool -> its own


def _error(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _missing(param: str) -> ApiError:
    return _error(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def _invalid_value(value: Any, allowed: tuple[str, ...], param: str) -> ApiError:
    shown = ", ".join(f"'{v}'" for v in allowed[:-1]) + f", and '{allowed[-1]}'"
    return _error(
        f"Invalid value: '{value}'. Supported values are: {shown}.", param, "invalid_value"
    )


def _invalid_type(param: str, expected: str, value: Any) -> ApiError:
    got = {str: "a string", list: "an array", dict: "an object", bool: "a boolean"}
    return _error(
        f"Invalid type for '{param}': expected {expected}, but got "
        f"{got.get(type(value), 'null' if value is None else 'a number')} instead.",
        param,
        "invalid_type",
    )


def input_items(body: JSON) -> list[JSON]:
    """The input as items: a string input is one user message."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def item_type(item: JSON) -> str:
    """An item's type; a bare `{"role", "content"}` is a message."""
    kind = item.get("type")
    return str(kind) if kind is not None else ("message" if "role" in item else "")


def check_shape(body: JSON) -> ApiError | None:
    if "model" not in body:
        return _missing("model")
    if not isinstance(body["model"], str):
        return _invalid_type("model", "a string", body["model"])
    value = body.get("input")
    if value is not None and not isinstance(value, str | list):
        return _invalid_type("input", "a string or an array of input items", value)
    for i, item in enumerate(value if isinstance(value, list) else []):
        if error := _check_item(i, item):
            return error
    return _check_tools(body.get("tools"))


def _check_item(i: int, item: Any) -> ApiError | None:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        return _invalid_type(where, "an object", item)
    kind = item_type(item)
    if kind not in ITEM_TYPES:
        return _invalid_value(kind, ITEM_TYPES, f"{where}.type")
    if kind == "message":
        if "role" not in item:
            return _missing(f"{where}.role")
        if item["role"] not in ROLES:
            return _invalid_value(item["role"], ROLES, f"{where}.role")
        if not isinstance(item.get("content"), str | list):
            return _missing(f"{where}.content")
    required = {
        "function_call": ("call_id", "name", "arguments"),
        "function_call_output": ("call_id", "output"),
        "custom_tool_call": ("call_id", "name", "input"),
        "custom_tool_call_output": ("call_id", "output"),
        "reasoning": ("summary",),
    }.get(kind, ())
    for field in required:
        if field not in item:
            return _missing(f"{where}.{field}")
    if kind in _CALL_OUTPUTS.values() and not isinstance(item["output"], str | list):
        return _invalid_type(f"{where}.output", "a string or an array", item["output"])
    return None


def _check_tools(tools: Any) -> ApiError | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        return _invalid_type("tools", "an array", tools)
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            return _invalid_type(where, "an object", tool)
        kind = tool.get("type")
        if kind not in TOOL_TYPES:
            return _invalid_value(kind, TOOL_TYPES, f"{where}.type")
        if kind in ("function", "custom", "namespace") and not isinstance(tool.get("name"), str):
            return _missing(f"{where}.name")  # a chat-shaped {"function": {...}} lands here
        if kind == "namespace" and (error := _check_tools(tool.get("tools") or [])):
            return error
    return None


def check_pairing(items: list[JSON]) -> ApiError | None:
    """Each output answers an earlier call; each call has an output later in the input."""
    calls: dict[tuple[str, str], None] = {}  # (call item type, call_id), in order
    answered: set[tuple[str, str]] = set()
    output_kinds = {output: call for call, output in _CALL_OUTPUTS.items()}
    for item in items:
        kind = item_type(item)
        call_id = str(item.get("call_id"))
        if kind in _CALL_OUTPUTS:
            calls[(kind, call_id)] = None
        elif kind in output_kinds:
            key = (output_kinds[kind], call_id)
            if key not in calls:
                return _error(
                    f"No tool call found for {_CALL_WORDS[key[0]]} output with call_id {call_id}.",
                    "input",
                )
            answered.add(key)
    for kind, call_id in calls:
        if (kind, call_id) not in answered:
            return _error(f"No tool output found for {_CALL_WORDS[kind]} {call_id}.", "input")
    return None


def _output_text(output: Any) -> str:
    if isinstance(output, list):
        return text_of([p for p in output if isinstance(p, dict)])
    return output if isinstance(output, str) else ""


def _chat_tools(tools: Any) -> tuple[list[JSON], frozenset[str]]:
    """Function tools for the chat model (namespaces flattened, custom tools take one string
    `input`), and the names of the custom tools."""
    chat: list[JSON] = []
    custom: set[str] = set()
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "namespace":
            inner, inner_custom = _chat_tools(tool.get("tools"))
            chat += inner
            custom |= inner_custom
            continue
        if tool.get("type") not in ("function", "custom"):
            continue
        parameters = tool.get("parameters") or {"type": "object", "properties": {}}
        if tool["type"] == "custom":
            custom.add(str(tool["name"]))
            parameters = _CUSTOM_PARAMETERS
        function = {
            "name": tool["name"],
            "description": tool.get("description", ""),
            "parameters": parameters,
        }
        chat.append({"type": "function", "function": function})
    return chat, frozenset(custom)


def offered_tools(body: JSON) -> list[Any]:
    """The tools a request offers: its `tools`, and those its `additional_tools` input items
    add (Codex sends its own there, in namespaces, with `tools` empty)."""
    tools = list(body.get("tools") or []) if isinstance(body.get("tools"), list) else []
    for item in input_items(body):
        if item_type(item) == "additional_tools" and isinstance(item.get("tools"), list):
            tools += item["tools"]
    return tools


def tool_namespaces(tools: Any, namespace: str | None = None) -> dict[str, str]:
    """Each namespaced tool's namespace, by the tool's name: its calls name it."""
    found: dict[str, str] = {}
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        if tool.get("type") == "namespace":
            found |= tool_namespaces(tool.get("tools"), tool["name"])
        elif namespace is not None:
            found[tool["name"]] = namespace
    return found


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        return {"type": "function", "function": {"name": choice.get("name")}}
    return None


def to_chat(body: JSON) -> JSON:
    messages: list[JSON] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    for item in input_items(body):
        kind = item_type(item)
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": text_of(item.get("content"))})
        elif kind in _CALL_OUTPUTS:
            arguments = item.get("arguments")
            if kind == "custom_tool_call":
                arguments = orjson.dumps({"input": item.get("input", "")}).decode()
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": arguments},
            }
            last = messages[-1] if messages else {}
            if last.get("role") == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in _CALL_OUTPUTS.values():
            output = _output_text(item.get("output"))
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": output}
            )
    if not messages:
        messages.append({"role": "user", "content": ""})
    chat: JSON = {"model": body.get("model"), "messages": messages}
    tools, _ = _chat_tools(offered_tools(body))
    if tools:
        chat["tools"] = tools
    if (choice := _chat_tool_choice(body.get("tool_choice"))) is not None:
        chat["tool_choice"] = choice
    if body.get("parallel_tool_calls") is False:
        chat["parallel_tool_calls"] = False
    if isinstance(body.get("max_output_tokens"), int):
        chat["max_tokens"] = body["max_output_tokens"]
    return chat


def count_prompt_tokens(body: JSON, tokenizer: Tokenizer = CHARS_4) -> int:
    return estimate_prompt_tokens(to_chat(body), tokenizer)


class Sealer:
    """Mints and checks reasoning items' encrypted_content under one secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._vouched: set[str] = set()  # sealed by another API, taken as this one's (replay)

    def vouch(self, items: list[JSON]) -> None:
        """Take the encrypted reasoning of an input as sealed here."""
        for item in items:
            blob = item.get("encrypted_content") if item_type(item) == "reasoning" else None
            if isinstance(blob, str):
                self._vouched.add(blob)

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._secret, _BLOB_VERSION + payload, hashlib.sha256).digest()

    def seal(self, reasoning: str, summary: str) -> str:
        payload = orjson.dumps({"reasoning": reasoning, "summary": summary})
        raw = _BLOB_VERSION + self._mac(payload) + payload
        return _BLOB_PREFIX + base64.urlsafe_b64encode(raw).decode()

    def valid(self, blob: str) -> bool:
        if blob in self._vouched:
            return True
        try:
            raw = base64.urlsafe_b64decode(blob.removeprefix(_BLOB_PREFIX).encode())
        except ValueError:
            return False
        if not blob.startswith(_BLOB_PREFIX) or raw[:1] != _BLOB_VERSION:
            return False
        mac, payload = raw[1 : 1 + _MAC_BYTES], raw[1 + _MAC_BYTES :]
        return hmac.compare_digest(mac, self._mac(payload))


def check_reasoning_items(items: list[JSON], body: JSON, sealer: Sealer) -> ApiError | None:
    for item in items:
        if item_type(item) != "reasoning":
            continue
        blob = item.get("encrypted_content")
        item_id = item.get("id", "")
        if blob is None:
            if body.get("store") is False and item_id:
                return ApiError(
                    404,
                    f"Item with id '{item_id}' not found. Items are not persisted when `store` "
                    "is set to false. Try again with `store` set to true, or remove this item "
                    "from your input.",
                    param="input",
                )
            continue
        if not isinstance(blob, str) or not sealer.valid(blob):
            return _error(
                f"The encrypted content for item {item_id} could not be verified. Reason: "
                "Encrypted content could not be decrypted or parsed.",
                None,
                "invalid_encrypted_content",
            )
    return None


class ResponsesCache:
    """The automatic prefix cache (prefix_cache.py) over tools, instructions, then input
    items, scoped by model and `prompt_cache_key`."""

    def __init__(self, *, min_tokens: int = 1024, tokenizer: Tokenizer = CHARS_4) -> None:
        self.prefixes = PrefixCache(min_tokens=min_tokens)
        self.tokenizer = tokenizer

    def clear(self) -> None:
        self.prefixes.clear()

    def account(self, body: JSON) -> int:
        """Read the cache for `body`, remember its prefixes; returns the cached tokens."""
        items = input_items(body)
        return self.prefixes.account(
            [body.get("model"), body.get("prompt_cache_key")],
            [body.get("tools"), body.get("instructions")],
            items,
            lambda n: count_prompt_tokens(body | {"input": items[:n]}, self.tokenizer),
        )


def _echo(meta: Meta) -> Echo:
    assert isinstance(meta.extra, Echo)
    return meta.extra


def _event(payload: JSON, content: bool = False) -> Event:
    name = str(payload["type"]).encode()
    return Event(b"event: " + name + b"\ndata: " + orjson.dumps(payload) + b"\n\n", content)


MAX_STORED = 10_000  # response ids remembered for `previous_response_id`, oldest forgotten


class ResponsesDialect(Dialect):
    """Stateful, one per Simulator: the secret encrypted reasoning is sealed with, and the
    prompt cache its usage is counted against."""

    def __init__(
        self,
        *,
        secret: bytes | None = None,
        cache_min_tokens: int = 1024,
        tokenizer: Tokenizer = CHARS_4,
    ) -> None:
        self.sealer = Sealer(secret if secret is not None else os.urandom(32))
        self.stored: OrderedDict[str, None] = OrderedDict()  # ids answered with `store` on
        self.prompt_cache = ResponsesCache(min_tokens=cache_min_tokens, tokenizer=tokenizer)
        self.tokenizer = tokenizer

    def check_auth(self, headers: Mapping[str, str], api_key: str) -> ApiError | None:
        return OPENAI.check_auth(headers, api_key)

    def invalid_json(self) -> ApiError:
        return ApiError(400, INVALID_JSON)

    def vouch(self, body: JSON) -> None:
        self.sealer.vouch(input_items(body))

    def check_body(self, body: JSON, headers: Mapping[str, str]) -> ApiError | None:
        if error := check_shape(body):
            return error
        previous = body.get("previous_response_id")
        items = input_items(body)
        if previous is not None:
            if previous not in self.stored:
                return _error(
                    f"Previous response with id '{previous}' not found.",
                    "previous_response_id",
                    "previous_response_not_found",
                )
            return check_reasoning_items(items, body, self.sealer)
        return check_pairing(items) or check_reasoning_items(items, body, self.sealer)

    def to_chat(self, body: JSON) -> JSON:
        return to_chat(body)

    def check_context(self, body: JSON, prompt_tokens: int, window: int) -> ApiError | None:
        if prompt_tokens <= window:
            return None
        return _error(CONTEXT_EXCEEDED, "input", "context_length_exceeded")

    def stream_failure(self, body: JSON, error: ApiError, meta: Meta) -> list[Event] | None:
        """How a streamed request learns of an error found once the stream is open (the
        window): `response.failed` after created / in_progress, as the API sends it."""
        if body.get("stream") is not True or error.code != "context_length_exceeded":
            return None
        meta = dataclasses.replace(meta, extra=self._echo(body, None))
        start = self._response(Reply(None), meta, "in_progress", [])
        failed = start | {
            "status": "failed",
            "error": {"code": error.code, "message": error.message},
        }
        return _numbered(
            [
                {"type": "response.created", "response": start},
                {"type": "response.in_progress", "response": start},
                {"type": "response.failed", "response": failed},
            ]
        )

    def annotate(self, body: JSON, chat: JSON, reply: Reply, meta: Meta) -> Meta:
        if body.get("store") is not False:
            self.stored[meta.id] = None
            if len(self.stored) > MAX_STORED:
                self.stored.popitem(last=False)
        cached = min(self.prompt_cache.account(body), meta.prompt_tokens)
        reasoning = self._reasoning(body, chat, reply, meta)
        tokens = reasoning.tokens if reasoning else 0
        return dataclasses.replace(
            meta,
            completion_tokens=meta.completion_tokens + tokens,
            cache_read_tokens=cached,
            extra=self._echo(body, reasoning),
        )

    def _echo(self, body: JSON, reasoning: ReasoningItem | None) -> Echo:
        request = {k: body.get(k) for k in _ECHOED}
        tools = offered_tools(body)
        return Echo(request, _chat_tools(tools)[1], reasoning, tool_namespaces(tools))

    def _reasoning(self, body: JSON, chat: JSON, reply: Reply, meta: Meta) -> ReasoningItem | None:
        setting = body.get("reasoning")
        include = body.get("include") or []
        sealed = ENCRYPTED_CONTENT in include
        if not sealed and not isinstance(setting, dict):
            return None
        hidden = reasoning_for(reply, chat)
        summary = hidden if isinstance(setting, dict) and setting.get("summary") else ""
        blob = self.sealer.seal(hidden, summary) if sealed else None
        item_id = "rs_" + meta.id.removeprefix("resp_")
        tokens = completion_tokens(Reply(hidden), self.tokenizer)
        return ReasoningItem(item_id, summary, blob, tokens)

    def fault_error(self, status: int, model: str) -> ApiError:
        return openai_fault_error(status, model)

    def error_body(self, error: ApiError, request_id: str) -> Any:
        return OPENAI.error_body(error, request_id)

    def headers(self, request_id: str, processing_ms: int, status: int) -> dict[str, str]:
        return OPENAI.headers(request_id, processing_ms, status)

    # --- rendering -------------------------------------------------------------------------

    def _items(self, reply: Reply, meta: Meta) -> list[JSON]:
        echo = _echo(meta)
        suffix = meta.id.removeprefix("resp_")
        items: list[JSON] = [echo.reasoning.wire()] if echo.reasoning else []
        if reply.content or not reply.tool_calls:
            text = {"type": "output_text", "text": reply.content or "", "annotations": []}
            items.append(
                {
                    "id": "msg_" + suffix,
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [text | {"logprobs": []}],
                }
            )
        for n, call in enumerate(reply.tool_calls):
            namespace = echo.namespaces.get(call.name)
            named = {"name": call.name} | ({"namespace": namespace} if namespace else {})
            if call.name in echo.custom_tools:
                items.append(
                    {
                        "id": f"ctc_{suffix}_{n}",
                        "type": "custom_tool_call",
                        "status": "completed",
                        "call_id": call.id,
                        **named,
                        "input": _custom_input(call.arguments),
                    }
                )
                continue
            items.append(
                {
                    "id": f"fc_{suffix}_{n}",
                    "type": "function_call",
                    "status": "completed",
                    "arguments": call.arguments,
                    "call_id": call.id,
                    **named,
                }
            )
        return items

    def _response(self, reply: Reply, meta: Meta, status: str, output: list[JSON]) -> JSON:
        request = _echo(meta).request
        reasoning = request.get("reasoning") or {}
        incomplete = status == "incomplete"
        return {
            "id": meta.id,
            "object": "response",
            "created_at": meta.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": request.get("instructions"),
            "max_output_tokens": request.get("max_output_tokens"),
            "model": meta.model,
            "output": output,
            "parallel_tool_calls": request.get("parallel_tool_calls", True) is not False,
            "previous_response_id": None,
            "prompt_cache_key": request.get("prompt_cache_key"),
            "reasoning": {
                "effort": reasoning.get("effort"),
                "summary": reasoning.get("summary"),
            },
            "store": request.get("store") is not False,
            "temperature": 1.0,
            "text": request.get("text") or {"format": {"type": "text"}},
            "tool_choice": request.get("tool_choice") or "auto",
            "tools": request.get("tools") or [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": _usage(meta) if status in ("completed", "incomplete") else None,
            "user": None,
            "metadata": {},
        }

    def render(self, reply: Reply, meta: Meta) -> JSON:
        status = "incomplete" if reply.finish_reason == "length" else "completed"
        return self._response(reply, meta, status, self._items(reply, meta))

    def stream_events(
        self, reply: Reply, meta: Meta, words_per_chunk: int, include_usage: bool
    ) -> list[Event]:
        start = self._response(reply, meta, "in_progress", [])
        payloads: list[tuple[JSON, bool]] = [
            ({"type": "response.created", "response": start}, False),
            ({"type": "response.in_progress", "response": start}, False),
        ]
        for index, item in enumerate(self._items(reply, meta)):
            payloads += _item_events(index, item, words_per_chunk)
        payloads.append(
            ({"type": "response.completed", "response": self.render(reply, meta)}, False)
        )
        return [
            _event(payload | {"sequence_number": n}, content)
            for n, (payload, content) in enumerate(payloads)
        ]

    def garbage_event(self, meta: Meta) -> bytes:
        return b'event: response.output_text.delta\ndata: {"type":"response.output_text.del\n\n'


def _numbered(payloads: list[JSON]) -> list[Event]:
    return [_event(payload | {"sequence_number": n}) for n, payload in enumerate(payloads)]


def _custom_input(arguments: str) -> str:
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    return str(value.get("input", "")) if isinstance(value, dict) else arguments


def _usage(meta: Meta) -> JSON:
    echo = meta.extra if isinstance(meta.extra, Echo) else None
    reasoning = echo.reasoning.tokens if echo and echo.reasoning else 0
    return {
        "input_tokens": meta.prompt_tokens,
        "input_tokens_details": {"cached_tokens": meta.cache_read_tokens},
        "output_tokens": meta.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": meta.prompt_tokens + meta.completion_tokens,
    }


def _item_events(index: int, item: JSON, words_per_chunk: int) -> list[tuple[JSON, bool]]:
    """One output item's events: added, its parts and deltas, done."""
    kind = item["type"]
    at = {"output_index": index, "item_id": item["id"]}
    if kind == "message":
        opening = item | {"status": "in_progress", "content": []}
    elif kind == "reasoning":
        opening = item | {"summary": []}
    elif kind == "function_call":
        opening = item | {"status": "in_progress", "arguments": ""}
    else:
        opening = item | {"status": "in_progress", "input": ""}
    events: list[tuple[JSON, bool]] = [
        ({"type": "response.output_item.added", "output_index": index, "item": opening}, False)
    ]
    if kind == "message":
        part = item["content"][0]
        empty = part | {"text": ""}
        at_part = at | {"content_index": 0}
        events.append(({"type": "response.content_part.added", **at_part, "part": empty}, False))
        for piece in split_words(part["text"], words_per_chunk):
            delta = {"type": "response.output_text.delta", **at_part, "delta": piece}
            events.append((delta | {"logprobs": []}, True))
        done = {"type": "response.output_text.done", **at_part, "text": part["text"]}
        events.append((done | {"logprobs": []}, False))
        events.append(({"type": "response.content_part.done", **at_part, "part": part}, False))
    elif kind == "reasoning":
        for k, part in enumerate(item["summary"]):
            at_summary = at | {"summary_index": k}
            empty = {"type": "summary_text", "text": ""}
            added = {"type": "response.reasoning_summary_part.added", **at_summary, "part": empty}
            events.append((added, False))
            for piece in split_words(part["text"], words_per_chunk):
                delta = {"type": "response.reasoning_summary_text.delta", **at_summary}
                events.append((delta | {"delta": piece}, True))
            done = {"type": "response.reasoning_summary_text.done", **at_summary}
            events.append((done | {"text": part["text"]}, False))
            closed = {"type": "response.reasoning_summary_part.done", **at_summary, "part": part}
            events.append((closed, False))
    elif kind == "function_call":
        for piece in fragments(item["arguments"]):
            delta = {"type": "response.function_call_arguments.delta", **at, "delta": piece}
            events.append((delta, True))
        done = {"type": "response.function_call_arguments.done", **at}
        events.append((done | {"name": item["name"], "arguments": item["arguments"]}, False))
    else:
        for piece in fragments(item["input"]):
            delta = {"type": "response.custom_tool_call_input.delta", **at, "delta": piece}
            events.append((delta, True))
        done = {"type": "response.custom_tool_call_input.done", **at, "input": item["input"]}
        events.append((done, False))
    events.append(
        ({"type": "response.output_item.done", "output_index": index, "item": item}, False)
    )
    return events
