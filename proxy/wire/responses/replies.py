"""OpenAI Responses: reading a reply, taking the proxy's own calls out of it. Errors are
OpenAI-shaped, as on the chat route."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.guards.tool_rules import Verdict
from proxy.messages import Message
from proxy.pipeline import recall
from proxy.upstream.base import UpstreamReply
from proxy.wire import translate
from proxy.wire.chat import replies as chat
from proxy.wire.responses.view import CALLS, ResponsesView, chat_call


def reply_message(output: list[dict[str, Any]]) -> Message:
    """A response's output items as a chat-shaped assistant message."""
    texts = [
        part.get("text", "")
        for item in output
        if item.get("type") == "message"
        for part in item.get("content") or []
        if isinstance(part, dict) and part.get("type") == "output_text"
    ]
    calls = [chat_call(item) for item in output if item.get("type") in CALLS]
    message: Message = {"role": "assistant", "content": "\n".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _arguments(item: dict[str, Any]) -> Any:
    return item.get("arguments") if item.get("type") == "function_call" else item.get("input")


def without_recall_items(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        item
        for item in output
        if not (item.get("type") in CALLS and item.get("name") == recall.TOOL_NAME)
    ]


def denied_items(output: list[dict[str, Any]], verdict: Verdict) -> set[int]:
    """The positions in `output` of the calls the guard denied: its positions count the
    client's calls (the proxy's own left out) in order."""
    theirs = [
        i
        for i, item in enumerate(output)
        if item.get("type") in CALLS and item.get("name") != recall.TOOL_NAME
    ]
    return {theirs[p] for p in verdict.denied if p < len(theirs)}


def said_item(text: str, item_id: str) -> dict[str, Any]:
    """The guard's text as an output message of its own."""
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def client_message(reply: UpstreamReply, alias: str, request_id: str) -> dict[str, Any]:
    return translate.client_message(reply, response_from_chat, alias, request_id)


def client_body(reply: UpstreamReply, alias: str, request_id: str) -> bytes:
    return translate.client_body(reply, response_from_chat, alias, request_id)


def response_from_chat(data: dict[str, Any], alias: str, request_id: str) -> dict[str, Any]:
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    if message.get("content"):
        text = {"type": "output_text", "text": message["content"], "annotations": []}
        output.append(
            {
                "type": "message",
                "id": f"msg_{request_id}",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        )
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{call.get('id')}",
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments") or "{}",
                "status": "completed",
            }
        )
    usage = data.get("usage") or {}
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "id": f"resp_{data.get('id') or request_id}",
        "object": "response",
        "created_at": data.get("created", 0),
        "status": "completed",
        "model": alias,
        "output": output,
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached or 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
    }


def response_events(response: dict[str, Any]) -> bytes:
    """A whole response as the event sequence a Responses client expects."""
    events: list[tuple[str, dict[str, Any]]] = []
    started = {**response, "status": "in_progress", "output": []}
    events.append(("response.created", {"response": started}))
    events.append(("response.in_progress", {"response": started}))
    for index, item in enumerate(response["output"]):
        opened = {**item, "status": "in_progress"}
        if item["type"] == "message":
            opened["content"] = []
        elif item["type"] == "function_call":
            opened["arguments"] = ""
        elif item["type"] == "custom_tool_call":
            opened["input"] = ""
        events.append(("response.output_item.added", {"output_index": index, "item": opened}))
        if item["type"] == "message":
            part = item["content"][0]
            at = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append(("response.content_part.added", {**at, "part": {**part, "text": ""}}))
            events.append(("response.output_text.delta", {**at, "delta": part["text"]}))
            events.append(("response.output_text.done", {**at, "text": part["text"]}))
            events.append(("response.content_part.done", {**at, "part": part}))
        elif item["type"] == "function_call":
            at = {"item_id": item["id"], "output_index": index}
            events.append(
                ("response.function_call_arguments.delta", {**at, "delta": item["arguments"]})
            )
            events.append(
                ("response.function_call_arguments.done", {**at, "arguments": item["arguments"]})
            )
        elif item["type"] == "custom_tool_call":
            at = {"item_id": item["id"], "output_index": index}
            events.append(("response.custom_tool_call_input.delta", {**at, "delta": item["input"]}))
            events.append(("response.custom_tool_call_input.done", {**at, "input": item["input"]}))
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    events.append(("response.completed", {"response": response}))
    return b"".join(
        b"event: "
        + name.encode()
        + b"\ndata: "
        + orjson.dumps({"type": name, "sequence_number": number, **data})
        + b"\n\n"
        for number, (name, data) in enumerate(events)
    )


class Replies:
    """Reads replies for one Responses exchange (Flow's `Replies`)."""

    def __init__(self, view: ResponsesView) -> None:
        self.view = view

    def reply_message(self, reply: UpstreamReply) -> Message:
        if "choices" in reply.data:  # a translated call's chat completion
            return chat.reply_message(reply)
        output = [i for i in reply.data.get("output") or [] if isinstance(i, dict)]
        self.view.remember_turn(output)
        return reply_message(output)

    def without_recall(self, reply: UpstreamReply, theirs: list[dict[str, Any]]) -> UpstreamReply:
        if "choices" in reply.data:
            return chat.without_recall(reply, theirs)
        data = reply.data
        data["output"] = without_recall_items(data.get("output") or [])
        return UpstreamReply(data, orjson.dumps(data), reply.headers)

    def refused(self, reply: UpstreamReply, verdict: Verdict) -> UpstreamReply:
        """The denied call items taken out, the guard's text as a message item after the rest
        (no call left: the agent reads an answer, not calls to run)."""
        if "choices" in reply.data:
            return chat.refused(reply, verdict)
        data = reply.data
        output = [i for i in data.get("output") or [] if isinstance(i, dict)]
        denied = denied_items(output, verdict)
        kept = [item for i, item in enumerate(output) if i not in denied]
        data["output"] = [*kept, said_item(verdict.text, f"msg_guard_{data.get('id', '')}")]
        return UpstreamReply(data, orjson.dumps(data), reply.headers)
