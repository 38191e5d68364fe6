"""The simulator's scripted "model": what it answers, and what things cost in tokens.

Everything here works on an OpenAI-shaped chat body (the Anthropic twin converts first) and is
a pure function of that body, so the same request always gets the same answer.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .plans import plan, request_text, unwrapped

JSON = dict[str, Any]

SNIPPET_CHARS = 200  # how much of a user text or tool result the scripted answers quote
_SCALAR_PLACEHOLDERS: dict[str, Any] = {
    "string": "example",
    "integer": 1,
    "number": 1,
    "boolean": True,
    "array": [],
    "null": None,
}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, exactly as it goes on the wire


@dataclass(frozen=True)
class Reply:
    """One assistant turn, independent of the wire dialect it is rendered in."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"  # OpenAI vocabulary: "stop" | "tool_calls" | "length"


def text_of(content: Any) -> str:
    """The plain text of a message content: a string, a list of text parts, or nothing."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


# The model's tokenizer: the tokens of some texts, counted together. The default is four
# characters a token over their total; a test that needs another tokenizer (a model whose
# tokens differ from the proxy's estimate) gives the Simulator its own.
Tokenizer = Callable[[Sequence[str]], int]


def chars_per_token(chars: float) -> Tokenizer:
    """A tokenizer of `chars` characters a token (ceil over the total)."""
    return lambda texts: math.ceil(sum(map(len, texts)) / chars)


CHARS_4 = chars_per_token(4.0)


def _message_texts(message: JSON) -> list[str]:
    texts = [text_of(message.get("content"))]
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            texts += [str(function.get("name", "")), str(function.get("arguments", ""))]
    return texts


def estimate_prompt_tokens(body: JSON, tokenizer: Tokenizer = CHARS_4) -> int:
    """The tokenizer over contents, tool call names+arguments and tool schemas (their JSON),
    +4 per message."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    texts = [text for message in messages for text in _message_texts(message)]
    if body.get("tools"):
        texts.append(orjson.dumps(body["tools"]).decode())
    return tokenizer(texts) + 4 * len(messages)


def completion_tokens(reply: Reply, tokenizer: Tokenizer = CHARS_4) -> int:
    texts = [reply.content or ""]
    texts += [text for call in reply.tool_calls for text in (call.name, call.arguments)]
    return max(1, tokenizer(texts))


def max_output_tokens(body: JSON) -> int | None:
    """The requested completion budget; max_completion_tokens wins like it does at OpenAI."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def request_digest(body: JSON) -> str:
    """Hash of what determines the answer (not `stream`), so stream and non-stream agree."""
    key = {k: body.get(k) for k in ("model", "messages", "tools", "tool_choice")}
    return hashlib.sha256(orjson.dumps(key, option=orjson.OPT_SORT_KEYS)).hexdigest()


def tool_call_id(digest: str, index: int, prefix: str = "call_") -> str:
    return prefix + hashlib.sha256(f"{digest}:{index}".encode()).hexdigest()[:24]


def scripted_reply(body: JSON) -> Reply:
    """The scripted behaviour: summarize when asked to, quote tool results, answer JSON when
    a schema asks for it, call a tool the user names (or the one a plausible model would
    call for the request: plans.py), or echo."""
    messages: list[JSON] = body["messages"]
    summary = summary_reply(messages, max_output_tokens(body))
    if summary is not None:
        return limit_reply(summary, body)
    # Claude Code ends a turn with `role: "system"` entries after the user's message: the turn
    # is what came before them.
    turn = _without_trailing_context(messages)
    ending = turn[-1]
    if ending.get("role") == "tool":
        return limit_reply(Reply(_quote_tool_results(turn)), body)
    if (answer := json_answer(body)) is not None:
        return limit_reply(Reply(answer), body)
    calls = _planned_calls(body, ending) if ending.get("role") == "user" else []
    if calls:
        digest = request_digest(body)
        tool_calls = tuple(
            ToolCall(tool_call_id(digest, i), name, orjson.dumps(args).decode())
            for i, (name, args) in enumerate(calls)
        )
        return Reply(None, tool_calls, "tool_calls")
    said = request_text(_last_user_text(messages))
    return limit_reply(Reply(f"You said: {said[:SNIPPET_CHARS]}"), body)


def limit_reply(reply: Reply, body: JSON) -> Reply:
    """Cut a text answer at max_tokens the way a real model stops: finish_reason "length"."""
    budget = max_output_tokens(body)
    if budget is None or reply.tool_calls or completion_tokens(reply) <= budget:
        return reply
    return Reply((reply.content or "")[: budget * 4], (), "length")


def reply_from_message(message: JSON, body: JSON) -> Reply:
    """Turn a responder's assistant message into a Reply, filling in what a test left out."""
    digest = request_digest(body)
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = orjson.dumps(arguments).decode()
        calls.append(
            ToolCall(call.get("id") or tool_call_id(digest, i), function.get("name", ""), arguments)
        )
    finish = message.get("finish_reason") or ("tool_calls" if calls else "stop")
    return Reply(message.get("content"), tuple(calls), finish)


def _without_trailing_context(messages: list[JSON]) -> list[JSON]:
    """The turn without what an agent appends after it: `role: "system"` entries, and user
    messages holding only context (Claude Code's reminders after a tool result)."""
    end = len(messages)
    while end > 1 and (
        messages[end - 1].get("role") == "system"
        or (
            messages[end - 1].get("role") == "user"
            and messages[end - 2].get("role") == "tool"
            and not request_text(text_of(messages[end - 1].get("content")))
        )
    ):
        end -= 1
    return messages[:end]


def json_answer(body: JSON) -> str | None:
    """What a model asked for JSON by a schema answers (response_format json_schema): an
    object filling the schema's required fields; None when no schema is asked for."""
    response_format = body.get("response_format")
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        return None
    return orjson.dumps(placeholder(schema)).decode()


def _last_user_text(messages: list[JSON]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return text_of(message.get("content"))
    return ""


def _quote_tool_results(messages: list[JSON]) -> str:
    names = {
        call.get("id"): (call.get("function") or {}).get("name", "tool")
        for message in messages
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or []
        if isinstance(call, dict)
    }
    results: list[JSON] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        results.insert(0, message)
    return "\n".join(
        f"{names.get(m.get('tool_call_id'), 'tool')} returned: "
        f"{unwrapped(text_of(m.get('content')))[:SNIPPET_CHARS]}"
        for m in results
    )


def _tool_schemas(body: JSON) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for tool in body.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            schemas[function["name"]] = function.get("parameters")
    return schemas


def _planned_calls(body: JSON, ending: JSON) -> list[tuple[str, JSON]]:
    """Which tools to call, honouring tool_choice and parallel_tool_calls like OpenAI does."""
    schemas = _tool_schemas(body)
    choice = body.get("tool_choice")
    if not schemas or choice == "none":
        return []
    text = request_text(text_of(ending.get("content")))
    calls = _calls_with_json(text, schemas)
    forced = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    if forced:
        calls = [c for c in calls if c[0] == forced] or [
            (forced, placeholder_args(schemas.get(forced)))
        ]
    elif not calls:
        named = _first_mention(text, schemas)
        planned = None if named else plan(text, schemas, placeholder_args)
        if planned is not None:
            calls = [planned]
        else:
            named = named or (next(iter(schemas)) if choice == "required" else None)
            calls = [(named, placeholder_args(schemas[named]))] if named else []
    return calls[:1] if body.get("parallel_tool_calls") is False else calls


def _names_pattern(schemas: dict[str, Any]) -> str:
    # Longest first so "read_file_lines" is not matched as "read_file".
    names = sorted(schemas, key=len, reverse=True)
    return r"(?<![\w-])(" + "|".join(re.escape(n) for n in names) + r")"


def _calls_with_json(text: str, schemas: dict[str, Any]) -> list[tuple[str, JSON]]:
    """Every `name({...json...})` in the text, in order."""
    pattern = re.compile(_names_pattern(schemas) + r"\(\s*")
    decoder = json.JSONDecoder()  # orjson has no raw_decode: we need "parse a prefix"
    calls: list[tuple[str, JSON]] = []
    position = 0
    while match := pattern.search(text, position):
        position = match.end()
        try:
            args, position = decoder.raw_decode(text, match.end())
        except ValueError:
            continue
        if isinstance(args, dict):
            calls.append((match.group(1), args))
    return calls


def _first_mention(text: str, schemas: dict[str, Any]) -> str | None:
    match = re.search(_names_pattern(schemas) + r"(?![\w-])", text)
    return match.group(1) if match else None


def placeholder_args(schema: Any) -> JSON:
    """Arguments filling a tool's required parameters with placeholders by JSON-schema type."""
    args = placeholder(schema if isinstance(schema, dict) else {"type": "object"})
    return args if isinstance(args, dict) else {}


def placeholder(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return "example"
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return placeholder(schema[key][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        return {name: placeholder(properties.get(name)) for name in schema.get("required") or []}
    return _SCALAR_PLACEHOLDERS.get(str(kind), "example")


# --- structured summaries (the proxy's compaction summarizer) ---------------------------------

# A request is a summary request when its system prompt names these sections; the transcript
# is its last user message, one block per message headed "[#n role ...]".
SUMMARY_SECTIONS = ("SESSION INTENT", "SUMMARY", "ARTIFACTS", "NEXT STEPS")
SUMMARY_SECTION_CHARS = 1_000
SUMMARY_MAX_ARTIFACTS = 20
_BLOCK_HEADER = re.compile(r"^\[#\d+ (\w+)[^\]\n]*\]$", re.MULTILINE)
_SECTION_HEADING = re.compile(r"^(" + "|".join(SUMMARY_SECTIONS) + r"):[ \t]*$", re.MULTILINE)
_ARTIFACT = re.compile(
    r"\bap_[0-9a-f]{24}\b"  # archive references
    r"|(?<![\w/.-])(?:[\w.-]+/)+[\w.-]+\.\w+"  # dir/file.ext
    r"|\b[\w-]+\.(?:py|md|txt|json|ya?ml|toml|js|ts|rs|go|sh|cfg|ini|csv|html|css)\b"
)
_CALLED_TOOL = re.compile(r"^→ calls ([\w.-]+)", re.MULTILINE)


def is_summary_request(messages: list[JSON]) -> bool:
    """A request of the proxy's summarizer: its system prompt names the four sections."""
    system = "\n".join(text_of(m.get("content")) for m in messages if m.get("role") == "system")
    return all(f"{section}:" in system for section in SUMMARY_SECTIONS)


def summary_reply(messages: list[JSON], max_tokens: int | None = None) -> Reply | None:
    """The four sections, deterministically: intent from the first user message (or an
    earlier summary's intent), artifacts from paths and ap_ refs, next steps from the last
    user message. Like a model that keeps to the word limit it is given, the sections share
    `max_tokens` (when set) rather than being cut at it. None when this is not a summary
    request."""
    if not is_summary_request(messages):
        return None
    transcript = _last_user_text(messages)
    blocks = transcript_blocks(transcript)
    users = [text for role, text in blocks if role == "user"]
    earlier = [summary_sections(t) for t in users if "SESSION INTENT:" in t]
    fresh = [t for t in users if "SESSION INTENT:" not in t]
    intent = earlier[0].get("SESSION INTENT", "") if earlier else (fresh[0] if fresh else "")
    steps = fresh[-1] if fresh else (earlier[-1].get("NEXT STEPS", "") if earlier else "")
    roles = [role for role, _ in blocks]
    tools = list(dict.fromkeys(_CALLED_TOOL.findall(transcript)))
    summary = (
        f"{len(blocks)} earlier messages: {roles.count('user')} from the user, "
        f"{roles.count('assistant')} from the assistant, {roles.count('tool')} tool results. "
        f"Tools used: {', '.join(tools) or 'none'}."
    )
    artifacts = list(dict.fromkeys(_ARTIFACT.findall(transcript)))[:SUMMARY_MAX_ARTIFACTS]
    chars = SUMMARY_SECTION_CHARS
    if max_tokens is not None:  # a quarter of the budget each, in chars, with some slack
        chars = max(16, min(chars, int(max_tokens * 4 * 0.85) // 4))
    listed = "\n".join(f"- {a}" for a in artifacts) or "- none"
    sections = {
        "SESSION INTENT": intent.strip()[:chars],
        "SUMMARY": summary[:chars],
        "ARTIFACTS": listed[:chars],
        "NEXT STEPS": steps.strip()[:chars],
    }
    return Reply("\n\n".join(f"{name}:\n{text}" for name, text in sections.items()))


def transcript_blocks(transcript: str) -> list[tuple[str, str]]:
    """(role, text) for each "[#n role ...]" block of a summarizer transcript."""
    headers = list(_BLOCK_HEADER.finditer(transcript))
    if not headers:
        return []
    ends = [h.start() for h in headers[1:]] + [len(transcript)]
    return [
        (h.group(1), transcript[h.end() : end].strip())
        for h, end in zip(headers, ends, strict=True)
    ]


def summary_sections(text: str) -> dict[str, str]:
    """The sections of a structured summary, by heading."""
    headings = list(_SECTION_HEADING.finditer(text))
    if not headings:
        return {}
    ends = [h.start() for h in headings[1:]] + [len(text)]
    return {h.group(1): text[h.end() : end].strip() for h, end in zip(headings, ends, strict=True)}
