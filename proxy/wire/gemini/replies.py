"""Gemini: reading a reply (native, or a translated chat completion), taking the proxy's own
calls out of it, the response a chat completion becomes, and Google's error shape
(`{"error": {"code", "message", "status"}}`)."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.errors import ProxyError
from proxy.guards.tool_rules import Verdict
from proxy.messages import Message
from proxy.pipeline import recall
from proxy.upstream.base import UpstreamHTTPError, UpstreamReply
from proxy.wire.chat import replies as chat
from proxy.wire.gemini.request import field
from proxy.wire.gemini.view import GeminiView

# Google's canonical status names, by HTTP status (google.rpc.Code).
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
FINISH_REASONS = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def status_name(status: int) -> str:
    return STATUSES.get(status) or ("INTERNAL" if status >= 500 else "FAILED_PRECONDITION")


def error_body(error: ProxyError, request_id: str | None) -> dict[str, Any]:
    """A proxy error in Google's shape; the proxy's own code and details in an ErrorInfo."""
    inner: dict[str, Any] = {
        "code": error.status,
        "message": error.message,
        "status": status_name(error.status),
    }
    extra = error.body(request_id)["error"]
    metadata = {
        k: v if isinstance(v, str) else orjson.dumps(v).decode()
        for k, v in (extra.items() if isinstance(extra, dict) else ())
        if k not in ("message", "code") and v is not None
    }
    if error.code or metadata:
        info = {"@type": ERROR_INFO, "reason": str(error.code or error.type)}
        inner["details"] = [{**info, "domain": "agentproxy", "metadata": metadata}]
    return {"error": inner}


def passthrough_body(error: UpstreamHTTPError, request_id: str) -> bytes:
    """A provider's error in Google's shape: Google's own unchanged, an OpenAI-shaped one (a
    translated call) or a non-JSON one rewrapped; with what recovery tried added."""
    try:
        parsed = orjson.loads(error.body)
    except orjson.JSONDecodeError:
        parsed = None
    inner = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(inner, dict) and isinstance(inner.get("status"), str):
        if not error.extra:
            return error.body
        inner.setdefault("details", []).append(
            {"@type": ERROR_INFO, "reason": "recovery", "domain": "agentproxy",
             "metadata": {k: str(v) for k, v in error.extra.items()}}
        )  # fmt: skip
        return orjson.dumps(parsed)
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        message = inner["message"]
    else:
        message = error.plain_message()
    body: dict[str, Any] = {
        "error": {"code": error.status, "message": message, "status": status_name(error.status)}
    }
    metadata = {"request_id": request_id, **{k: str(v) for k, v in error.extra.items()}}
    body["error"]["details"] = [
        {"@type": ERROR_INFO, "reason": "upstream_error", "domain": "agentproxy",
         "metadata": metadata}
    ]  # fmt: skip
    return orjson.dumps(body)


def first_parts(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts of a response's first candidate."""
    candidates = data.get("candidates")
    first = candidates[0] if isinstance(candidates, list) and candidates else None
    content = first.get("content") if isinstance(first, dict) else None
    parts = content.get("parts") if isinstance(content, dict) else None
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def is_recall(part: dict[str, Any]) -> bool:
    call = field(part, "functionCall")
    return isinstance(call, dict) and call.get("name") == recall.TOOL_NAME


class Replies:
    """Reads replies for one Gemini exchange (Flow's `Replies`)."""

    def __init__(self, view: GeminiView) -> None:
        self.view = view
        self._round = 0

    def reply_message(self, reply: UpstreamReply) -> Message:
        if "choices" in reply.data:  # a translated call's chat completion
            return chat.reply_message(reply)
        self._round += 1
        return self.view.remember_turn(first_parts(reply.data), f"reply{self._round}")

    def without_recall(self, reply: UpstreamReply, theirs: list[dict[str, Any]]) -> UpstreamReply:
        if "choices" in reply.data:
            return chat.without_recall(reply, theirs)
        data = reply.data
        for candidate in data.get("candidates") or ():
            content = candidate.get("content") if isinstance(candidate, dict) else None
            if isinstance(content, dict) and isinstance(content.get("parts"), list):
                content["parts"] = [p for p in content["parts"] if not is_recall(p)]
        return UpstreamReply(data, orjson.dumps(data), reply.headers)

    def refused(self, reply: UpstreamReply, verdict: Verdict) -> UpstreamReply:
        """The denied functionCall parts taken out, the guard's text as a part after the
        rest (no call left: an answer, not calls to run)."""
        if "choices" in reply.data:
            return chat.refused(reply, verdict)
        data = reply.data
        candidates = data.get("candidates") or [{}]
        first = candidates[0] if isinstance(candidates[0], dict) else {}
        content = first.get("content")
        content = content if isinstance(content, dict) else {}
        parts = first_parts(data)
        kept = without_denied(parts, denied_positions(parts, verdict, 0))
        first["content"] = {"role": "model", **content, "parts": [*kept, {"text": verdict.text}]}
        data["candidates"] = [first, *candidates[1:]]
        return UpstreamReply(data, orjson.dumps(data), reply.headers)


def client_calls(parts: list[dict[str, Any]]) -> int:
    """How many of the parts are the client's calls (functionCalls not the proxy's own)."""
    return sum(1 for p in parts if field(p, "functionCall") and not is_recall(p))


def denied_positions(parts: list[dict[str, Any]], verdict: Verdict, before: int) -> set[int]:
    """Which of the parts the guard denied: its positions count the client's calls in order,
    `before` of them in parts earlier than these."""
    denied, seen = set(), before
    for index, part in enumerate(parts):
        if field(part, "functionCall") and not is_recall(part):
            if seen in verdict.denied:
                denied.add(index)
            seen += 1
    return denied


def without_denied(parts: list[dict[str, Any]], denied: set[int]) -> list[dict[str, Any]]:
    return [p for i, p in enumerate(parts) if i not in denied]


def client_response(reply: UpstreamReply, alias: str, request_id: str) -> dict[str, Any]:
    """The reply as the client reads it: as sent, or translated from a chat completion."""
    if "choices" not in reply.data:
        return reply.data
    return response_from_chat(reply.data, alias, request_id)


def response_from_chat(data: dict[str, Any], alias: str, request_id: str) -> dict[str, Any]:
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    parts: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        parts.append({"text": reasoning, "thought": True})
    if message.get("content"):
        parts.append({"text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            args = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            args = {}
        native = {"id": call.get("id"), "name": function.get("name")}
        parts.append({"functionCall": {**native, "args": args if isinstance(args, dict) else {}}})
    usage = data.get("usage") or {}
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": parts or [{"text": ""}]},
                "finishReason": FINISH_REASONS.get(choice.get("finish_reason"), "STOP"),
                "index": 0,
            }
        ],
        "usageMetadata": usage_metadata(usage),
        "modelVersion": alias,
        "responseId": str(data.get("id") or request_id),
    }


def usage_metadata(usage: dict[str, Any]) -> dict[str, Any]:
    """A chat usage as Google reports it."""
    prompt = usage.get("prompt_tokens", 0)
    output = usage.get("completion_tokens", 0)
    out: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": output,
        "totalTokenCount": usage.get("total_tokens", prompt + output),
    }
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, int) and cached:
        out["cachedContentTokenCount"] = cached
    return out


def degraded_response(alias: str, request_id: str, text: str) -> dict[str, Any]:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP",
             "index": 0}
        ],
        "usageMetadata": {"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0},
        "modelVersion": alias,
        "responseId": f"agentproxy-{request_id}",
    }  # fmt: skip


class Assembly:
    """A streamed answer as one response (the recording's), linear in the chunks: their parts
    in order, a run of text pieces of one kind (thought or not) joined once at the end; the
    last chunk's finish reason and usage."""

    def __init__(self) -> None:
        self._parts: list[dict[str, Any] | list[str]] = []  # a list: a run of text pieces
        self._thought: list[bool] = []
        self._last: dict[str, Any] | None = None

    def add(self, event: dict[str, Any]) -> None:
        self._last = event
        for part in first_parts(event):
            text, thought = part.get("text"), part.get("thought") is True
            if isinstance(text, str) and set(part) <= {"text", "thought"}:
                run = self._parts[-1] if self._parts else None
                if isinstance(run, list) and self._thought[-1] == thought:
                    run.append(text)
                    continue
                self._parts.append([text])
            else:
                self._parts.append(part)
            self._thought.append(thought)

    def answer(self) -> dict[str, Any] | None:
        if self._last is None:
            return None
        parts = [
            ({"text": "".join(p), "thought": True} if thought else {"text": "".join(p)})
            if isinstance(p, list)
            else p
            for p, thought in zip(self._parts, self._thought, strict=True)
        ]
        candidates = self._last.get("candidates")
        first = candidates[0] if isinstance(candidates, list) and candidates else {}
        candidate = {**(first if isinstance(first, dict) else {}), "index": 0}
        candidate["content"] = {"role": "model", "parts": parts}
        return {**self._last, "candidates": [candidate]}
