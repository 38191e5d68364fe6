"""Pure helpers on OpenAI chat messages: pairing rules, hashing, token estimates.

Nothing here does I/O or keeps state; every rewrite stage builds on these.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from proxy.tokens.parts import part_tokens

Message = dict[str, Any]
# The wire these messages are in: the one shape every request is rewritten in (a client's own
# wire is viewed as it), and the shared transports speak. The only format the core names.
CHAT = "chat"

# Characters per token for the estimate; calibrated later against reported usage.
CHARS_PER_TOKEN = 4.0
TOKENS_PER_MESSAGE = 4


@dataclass(frozen=True, slots=True)
class PairingProblem:
    index: int  # the message the problem is reported at
    kind: str  # "unanswered", "orphan", "duplicate", "misplaced"
    tool_call_id: str

    def __str__(self) -> str:
        return f"messages[{self.index}]: {self.kind} tool call {self.tool_call_id!r}"


def tool_call_ids(message: Message) -> list[str]:
    calls = message.get("tool_calls") or []
    return [c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)]


CUSTOM = "custom"  # a chat tool call of a custom tool: free text `input`, not JSON arguments


def call_body(call: Any) -> tuple[dict[str, Any] | None, str]:
    """The dict holding a tool call's name and input, and the key of its input. Chat has two
    kinds: a function call's `function.arguments` is JSON text; a custom tool's call
    (`type: "custom"`, as Codex's apply_patch and code-mode exec) has `custom.input`, free
    text (a patch, a script) that no one should parse as JSON."""
    if not isinstance(call, dict):
        return None, "arguments"
    if call.get("type") == CUSTOM:
        body = call.get(CUSTOM)
        return (body if isinstance(body, dict) else None), "input"
    body = call.get("function")
    return (body if isinstance(body, dict) else None), "arguments"


def takes_json(call: Any) -> bool:
    """Whether a tool call's input is meant as JSON (a function's), not free text."""
    return not (isinstance(call, dict) and call.get("type") == CUSTOM)


def call_name(call: Any) -> Any:
    body, _ = call_body(call)
    return body.get("name") if body is not None else None


def call_input(call: Any) -> Any:
    """A function call's arguments or a custom call's input, as the call carries it."""
    body, key = call_body(call)
    return body.get(key) if body is not None else None


def with_call_input(call: dict[str, Any], text: str) -> dict[str, Any]:
    """A copy of the call with its arguments (or custom input) now `text`."""
    body, key = call_body(call)
    kind = CUSTOM if call.get("type") == CUSTOM else "function"
    return {**call, kind: {**(body or {}), key: text}}


def pairing_problems(messages: Sequence[Message]) -> list[PairingProblem]:
    """OpenAI's rule: an assistant message with tool_calls is followed immediately by one tool
    message per id (any order); a tool message answers a call of that preceding block."""
    problems: list[PairingProblem] = []
    i, n = 0, len(messages)
    while i < n:
        message = messages[i]
        role = message.get("role")
        if role == "tool":
            problems.append(PairingProblem(i, "orphan", str(message.get("tool_call_id"))))
            i += 1
            continue
        if role != "assistant" or not message.get("tool_calls"):
            i += 1
            continue
        pending = dict.fromkeys(tool_call_ids(message))
        answered: set[str] = set()
        j = i + 1
        while j < n and messages[j].get("role") == "tool":
            call_id = str(messages[j].get("tool_call_id"))
            if call_id in answered:
                problems.append(PairingProblem(j, "duplicate", call_id))
            elif call_id not in pending:
                problems.append(PairingProblem(j, "orphan", call_id))
            answered.add(call_id)
            j += 1
        problems.extend(PairingProblem(i, "unanswered", c) for c in pending if c not in answered)
        i = j
    return problems


def is_valid_pairing(messages: Sequence[Message]) -> bool:
    return not pairing_problems(messages)


def message_hash(message: Message) -> int:
    """Stable across processes and key order: the identity of a message for caches."""
    return xxhash.xxh3_64_intdigest(orjson.dumps(message, option=orjson.OPT_SORT_KEYS))


def prefix_hashes(messages: Iterable[Message]) -> list[int]:
    """Rolling hashes: entry k identifies messages[0..k] as a whole."""
    rolling, out = 0, []
    for message in messages:
        rolling = xxhash.xxh3_64_intdigest(
            rolling.to_bytes(8, "little") + message_hash(message).to_bytes(8, "little")
        )
        out.append(rolling)
    return out


def text_of(message: Message) -> str:
    """Everything in a message that costs tokens, as one string."""
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
    for call in message.get("tool_calls") or []:
        body, key = call_body(call)
        if body is not None:
            parts.append(str(body.get("name", "")))
            parts.append(str(body.get(key, "")))
    return "\n".join(parts)


def non_text_tokens(message: Message) -> int:
    """Tokens of the parts that are not text (images, documents, audio: proxy/tokens/parts)."""
    content = message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(
        part_tokens(part)
        for part in content
        if isinstance(part, dict) and not isinstance(part.get("text"), str)
    )


def estimate_tokens(message: Message) -> int:
    text = int(len(text_of(message)) / CHARS_PER_TOKEN + 0.999)
    return TOKENS_PER_MESSAGE + text + non_text_tokens(message)
