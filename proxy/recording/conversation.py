"""A recorded turn as a conversation, in one shape whatever its wire: the inspector's timeline
shows each turn's new messages (`messages_in`), the model's answer and, for a failed turn, its
error, without knowing any wire format.

Each wire reads its own bodies into this shape (its `Conversation`, proxy/wire/<format>/
conversation.py, offered as `Wire.conversation`); this module holds the shape, the test of
whether a call opens a client turn (a person's prompt, not only tool results; a side call
never does: proxy/sessions/main_line.py, whose openings `opening` reads), and the bound every
shown text keeps (a timeline page is bounded in bytes).

A message: {"role": "system" | "user" | "assistant" | "tool", "parts": [part, ...]}; a part:
    {"type": "text", "text"}
    {"type": "tool_call", "id", "name", "arguments"}   arguments parsed when they are JSON
    {"type": "tool_result", "id", "content", "error"?}
    {"type": "reasoning", "text"?}                      a summary when readable, else none
    {"type": "other", "kind"}                           an image, a file, a provider's item
An answer is a message with "stop" (the stop or finish reason).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from typing import Any, Protocol

import orjson
import xxhash

from proxy.sessions.main_line import Opening

Message = dict[str, Any]
PART_CHARS = 4_000  # of one text, tool result or call's arguments shown in a timeline row
MESSAGES_CHARS = 48_000  # of all a row's new messages together
ANSWER_CHARS = 16_000  # of a row's answer
MESSAGES_SHOWN = 40  # a row's new messages, at most: the last ones (a whole history is new
# on a session's first turn, or after the client edited its past)
PARTS_SHOWN = 64  # of one message's parts (content blocks, tool calls)
NAME_CHARS = 200  # of a role, a tool's name, a call's id, a stop reason
BODIES = ("text", "content", "arguments")  # a part's fields cut to PART_CHARS
ERROR_CHARS = 4_000  # of a failed turn's error message, as recorded
FULL = "GET this turn with ?full=1 for all of it"
OPENING_ENTRIES = 16  # leading entries read for a call's opening, at most


class Conversation(Protocol):
    """How one wire's bodies read as a conversation."""

    def messages(self, items: list[Any]) -> list[Message]:
        """The entries of a request's list (its messages, input items, contents)."""
        ...

    def outside(self, body: Mapping[str, Any]) -> list[Message]:
        """What a request says outside its list: a system prompt or instructions, an input
        given as one string."""
        ...

    def answer(self, reply: Mapping[str, Any]) -> Message | None:
        """A whole reply's first answer: its text, tool calls and stop reason."""
        ...

    def error(self, reply: Mapping[str, Any]) -> str | None:
        """The message of an error envelope in this wire's shape; None when it is not one."""
        ...


def text(value: Any) -> dict[str, Any]:
    return {"type": "text", "text": value if isinstance(value, str) else _json(value)}


def tool_call(ident: Any, name: Any, arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str) and arguments[:1] in ("{", "["):
        with suppress(orjson.JSONDecodeError):
            arguments = orjson.loads(arguments)
    return {"type": "tool_call", "id": ident, "name": name, "arguments": arguments}


def tool_result(ident: Any, content: Any, error: Any = None) -> dict[str, Any]:
    part = {"type": "tool_result", "id": ident, "content": content}
    if error:
        part["error"] = True
    return part


def other(kind: Any) -> dict[str, Any]:
    return {"type": "other", "kind": str(kind)}


def reasoning(summary: str | None = None) -> dict[str, Any]:
    return {"type": "reasoning", "text": summary} if summary else {"type": "reasoning"}


def error_message(reply: Mapping[str, Any]) -> str | None:
    """The message of an error envelope `{"error": {"message": ...}}` (OpenAI's, Anthropic's
    and Google's alike), or `{"error": "..."}`."""
    error = reply.get("error")
    if isinstance(error, dict) and error.get("message") is not None:
        return str(error["message"])
    if isinstance(error, str):
        return error
    return None


def joined_text(content: Any) -> Any:
    """A list of text blocks as one text; anything else as it is."""
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, dict)]
        if texts and all(isinstance(t, str) for t in texts):
            return "\n".join(texts)  # type: ignore[arg-type]
    return content


def message(role: Any, parts: list[dict[str, Any]]) -> Message:
    return {"role": role if isinstance(role, str) else "user", "parts": parts}


def opens_turn(messages: list[Message]) -> bool:
    """Whether new messages open a client turn: the last of them the client wrote (a user's or
    a tool's) holds a user's words, not only the results of the tools the model called (those
    continue the turn: the agent's next call). The last, since an earlier prompt may be new
    again only for a changed marker (a cache breakpoint moved to the newest message)."""
    for entry in reversed(messages):
        if entry.get("role") not in ("user", "tool"):
            continue
        kinds = {p.get("type") for p in entry.get("parts") or []}
        return (
            entry.get("role") == "user"
            and bool(kinds & {"text", "other"})
            and ("tool_result" not in kinds)
        )
    return False


def opens_in(conversation: Conversation, items: list[Any], start: int) -> bool:
    """Whether a call's new entries, `items` past the first `start` (those it shares with
    the call it was compared with), open a client turn (`opens_turn`). The last the client
    wrote decides: read back to it only, so a call costs its last entries, not its history."""
    for at in range(len(items) - 1, max(start, 0) - 1, -1):
        read = conversation.messages([items[at]])
        if read and read[-1].get("role") in ("user", "tool"):
            return opens_turn(read)
    return False


def opening(
    conversation: Conversation, body: Mapping[str, Any], items: list[Any] | None
) -> Opening:
    """A call's opening (`MainLine`): the digests of the texts of its system and developer
    messages before its first user message, and of that user message's (None: it has none)."""
    leading = list(conversation.outside(body))
    for item in (items or [])[:OPENING_ENTRIES]:
        read = conversation.messages([item])
        leading.extend(read)
        if any(m.get("role") == "user" for m in read):
            break
    system = [m for m in leading if m.get("role") in ("system", "developer")]
    first = [m for m in leading if m.get("role") == "user"][:1]
    return _texts_digest(system), _texts_digest(first)


def _texts_digest(messages: list[Message]) -> int | None:
    if not messages:
        return None
    digest = xxhash.xxh3_64()
    for entry in messages:
        for part in entry.get("parts") or []:
            value = part.get("text") if part.get("type") == "text" else None
            if isinstance(value, str):
                digest.update(b"\0")
                digest.update(value.encode("utf-8", "surrogatepass"))
    return digest.intdigest()


def bounded(messages: list[Message], budget: int = MESSAGES_CHARS) -> tuple[list[Message], int]:
    """The last MESSAGES_SHOWN messages, each text at most PART_CHARS and all of them at most
    `budget` characters (the newest kept first), each cut one saying so; and how many were
    left out."""
    kept: list[Message] = []
    for entry in reversed(messages[-MESSAGES_SHOWN:]):
        if budget <= 0 and kept:
            break
        shown, used = _bounded_message(entry, max(budget, 200))
        kept.append(shown)
        budget -= used
    kept.reverse()
    return kept, len(messages) - len(kept)


def bounded_answer(answer: Message | None) -> Message | None:
    if answer is None:
        return None
    return _bounded_message(answer, ANSWER_CHARS)[0]


def cut(value: str, limit: int) -> str:
    """`value`, at most `limit` characters and a marker saying what was left out."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}… [{len(value) - limit:,} more characters: {FULL}]"


def _bounded_message(entry: Message, budget: int) -> tuple[Message, int]:
    """The message with its first PARTS_SHOWN parts, each cut (a name or an id to NAME_CHARS),
    within `budget` characters once past the first; and the characters it holds."""
    given = entry.get("parts") or []
    parts, used = [], 0
    for part in given[:PARTS_SHOWN]:
        limit = max(100, min(PART_CHARS, budget - used))
        shown = {}
        for field, value in part.items():
            if field in BODIES:
                shown[field], size = _bounded_value(value, limit)
                used += size
            else:
                shown[field] = cut(value, NAME_CHARS) if isinstance(value, str) else value
        parts.append(shown)
    if len(given) > PARTS_SHOWN:
        parts.append(other(f"{len(given) - PARTS_SHOWN:,} more parts: {FULL}"))
    bounded = {k: cut(v, NAME_CHARS) if isinstance(v, str) else v for k, v in entry.items()}
    return {**bounded, "parts": parts}, used


def _bounded_value(value: Any, limit: int) -> tuple[Any, int]:
    """A string cut to `limit`; a structure kept as it is when its JSON fits, else its JSON,
    pretty and cut."""
    if isinstance(value, str):
        return cut(value, limit), min(len(value), limit)
    if value is None or isinstance(value, bool | int | float):
        return value, 8
    raw = _json(value)
    if len(raw) <= limit:
        return value, len(raw)
    return cut(raw, limit), limit


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()
