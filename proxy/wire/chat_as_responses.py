"""A chat client's request to a deployment learnt to serve only /v1/responses
(proxy/upstream/no_chat.py: OpenAI's codex and pro models, a Codex-style server): sent as a
Responses request by the Responses wire's native upstream, its answer read back as a chat
completion (its events as chat chunks: chat_as_responses_stream.py). The chat wire's folder
imports nothing of the Responses wire's but through these shared modules (the exchange's
`AlternateWire`, set on every chat request and consulted per deployment: a fallback to one that
speaks chat gets chat).

What goes: messages (system and developer as input messages of that role, text and image
parts, assistant text and tool calls, tool results), function and custom tools (a custom
tool's calls and results as Responses' custom tool calls and outputs) and tool_choice, the output
limit, temperature, top_p, parallel_tool_calls, reasoning_effort, response_format, user,
metadata; `store: false`. Other chat fields (n, logprobs, stop, seed, ...) are not sent.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.exchange import Exchange
from proxy.guards.tool_rules import Verdict
from proxy.policies.spec import Deployment
from proxy.upstream.base import UpstreamReply
from proxy.upstream.facts import DeploymentFacts
from proxy.wire.responses.upstream import speaks_responses

WIRE = "responses"
COPIED = ("temperature", "top_p", "parallel_tool_calls", "user", "metadata", "stream")


class ChatAsResponses:
    """The chat wire's `AlternateWire`: Responses, for a deployment that serves no chat (as
    the app's learnt facts say)."""

    __slots__ = ("facts",)
    wire = WIRE

    def __init__(self, facts: DeploymentFacts) -> None:
        self.facts = facts

    def reaches(self, deployment: Deployment) -> bool:
        return speaks_responses(deployment, self.facts)

    def applies(self, deployment: Deployment) -> bool:
        return self.facts.no_chat.lacked_by(deployment) and speaks_responses(deployment, self.facts)

    @staticmethod
    def render(chat: dict[str, Any]) -> dict[str, Any]:
        return responses_request(chat)


def responses_request(chat: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": chat.get("model"), "input": _input(chat.get("messages"))}
    body.update((name, chat[name]) for name in COPIED if name in chat)
    limit = chat.get("max_completion_tokens", chat.get("max_tokens"))
    if isinstance(limit, int):
        body["max_output_tokens"] = limit
    if chat.get("tools"):
        tools = (_tool(t) for t in chat["tools"] if isinstance(t, dict))
        body["tools"] = [t for t in tools if t is not None]
    if "tool_choice" in chat:
        body["tool_choice"] = _tool_choice(chat["tool_choice"])
    if isinstance(chat.get("reasoning_effort"), str):
        body["reasoning"] = {"effort": chat["reasoning_effort"]}
    text_format = _text_format(chat.get("response_format"))
    if text_format is not None:
        body["text"] = {"format": text_format}
    body["store"] = False  # a chat client continues from its own history, never a stored one
    return body


def _input(messages: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    custom: set[Any] = set()  # ids of custom tool calls: their results are custom outputs
    for message in messages or ():
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "tool":
            output = message.get("content")
            custom_output = message.get("tool_call_id") in custom
            items.append(
                {
                    "type": "custom_tool_call_output" if custom_output else "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": output if isinstance(output, str) else _text(output),
                }
            )
            continue
        content = message.get("content")
        if role == "assistant":
            if content:
                items.append({"role": "assistant", "content": _text(content)})
            calls = message.get("tool_calls")
            for call in calls if isinstance(calls, list) else ():
                if not isinstance(call, dict):
                    continue
                if call.get("type") == "custom":  # free text, not JSON arguments
                    custom.add(call.get("id"))
                    body = as_dict(call.get("custom"))
                    text = body.get("input")
                    items.append(
                        {
                            "type": "custom_tool_call",
                            "call_id": call.get("id"),
                            "name": body.get("name"),
                            "input": text if isinstance(text, str) else "",
                        }
                    )
                    continue
                function = as_dict(call.get("function"))
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": function.get("arguments") or "{}",
                    }
                )
            continue
        items.append({"role": role, "content": _parts(content)})
    return items


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        p.get("text", "") for p in content or () if isinstance(p, dict) and p.get("type") == "text"
    )


def _parts(content: Any) -> Any:
    if not isinstance(content, list):
        return content if content is not None else ""
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            parts.append({"type": "input_text", "text": part.get("text", "")})
        elif part.get("type") == "image_url":
            image = part.get("image_url") or {}
            url = image.get("url") if isinstance(image, dict) else image
            parts.append({"type": "input_image", "image_url": url})
    return parts


FUNCTION_FIELDS = ("name", "description", "parameters", "strict")
CUSTOM_FIELDS = ("name", "description", "format")


def _tool(tool: dict[str, Any]) -> dict[str, Any] | None:
    """A chat function or custom tool as a Responses one, from its own fields only. Chat has
    no other kind: one naming a provider-side kind (file_search, code_interpreter) would reach
    objects stored in the shared provider account, so it is not sent (nor a function's own
    `type` or extra keys)."""
    custom = tool.get("custom")
    if tool.get("type") == "custom" and isinstance(custom, dict):
        return {"type": "custom"} | {k: custom[k] for k in CUSTOM_FIELDS if k in custom}
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        return None
    return {"type": "function"} | {k: function[k] for k in FUNCTION_FIELDS if k in function}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "function", "name": choice["function"].get("name")}
    if isinstance(choice, dict) and isinstance(choice.get("custom"), dict):
        return {"type": "custom", "name": choice["custom"].get("name")}
    return choice


def _text_format(response_format: Any) -> dict[str, Any] | None:
    if not isinstance(response_format, dict):
        return None
    if response_format.get("type") == "json_schema":
        schema = response_format.get("json_schema") or {}
        return {"type": "json_schema", **schema}
    return response_format


# --- answers --------------------------------------------------------------------------------


def is_response(data: dict[str, Any]) -> bool:
    return data.get("object") == "response" and "choices" not in data


def as_chat(reply: UpstreamReply, alias: str) -> UpstreamReply:
    """A Responses reply as a chat completion (a chat reply as it is)."""
    if not is_response(reply.data):
        return reply
    data = chat_completion(reply.data, alias)
    return UpstreamReply(data, orjson.dumps(data), reply.headers)


def chat_completion(response: dict[str, Any], alias: str) -> dict[str, Any]:
    output = [i for i in response.get("output") or () if isinstance(i, dict)]
    texts = [
        part.get("text", "")
        for item in output
        if item.get("type") == "message"
        for part in item.get("content") or ()
        if isinstance(part, dict) and part.get("type") == "output_text"
    ]
    calls = [chat_call(item) for item in output if item.get("type") in CALLS]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-{response.get('id') or ''}",
        "object": "chat.completion",
        "created": response.get("created_at") or 0,
        "model": alias,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason(response, calls)}
        ],
        "usage": chat_usage(response.get("usage")),
    }


def finish_reason(response: dict[str, Any], calls: list[Any]) -> str:
    if calls:
        return "tool_calls"
    details = response.get("incomplete_details") or {}
    if response.get("status") == "incomplete" and details.get("reason") == "max_output_tokens":
        return "length"
    return "stop"


def chat_usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


class ChatReplies:
    """The chat wire's `Replies` for an exchange whose reply may come back as Responses."""

    def __init__(self, ex: Exchange, chat: Any) -> None:
        self.ex = ex
        self.chat = chat  # proxy/wire/chat/replies.py

    def reply_message(self, reply: UpstreamReply) -> dict[str, Any]:
        message: dict[str, Any] = self.chat.reply_message(as_chat(reply, self.ex.alias))
        return message

    def without_recall(self, reply: UpstreamReply, theirs: list[dict[str, Any]]) -> UpstreamReply:
        answer: UpstreamReply = self.chat.without_recall(as_chat(reply, self.ex.alias), theirs)
        return answer

    def refused(self, reply: UpstreamReply, verdict: Verdict) -> UpstreamReply:
        answer: UpstreamReply = self.chat.refused(as_chat(reply, self.ex.alias), verdict)
        return answer


CALLS = ("function_call", "custom_tool_call")


def chat_call(item: dict[str, Any]) -> dict[str, Any]:
    """A Responses call item as chat's tool call: a custom tool's as chat's custom call."""
    if item.get("type") == "custom_tool_call":
        custom = {"name": item.get("name"), "input": item.get("input") or ""}
        return {"id": item.get("call_id"), "type": "custom", "custom": custom}
    function = {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}
    return {"id": item.get("call_id"), "type": "function", "function": function}


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
