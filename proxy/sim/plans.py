"""The simulated model's plan for a natural request: which of the offered tools a plausible
model would call for "list the files here", "show me README.md" or "search for TODO", and
with what arguments.

Table-driven and a pure function of the request's text and the tools offered, so the same
request always plans the same call (replay and the prefix-stable law rely on it). A request
a row does not match plans nothing (the model answers in text).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

JSON = dict[str, Any]
Placeholder = Callable[[Any], Any]

# Context an agent wraps around the user's words: Claude Code's <system-reminder>, Codex's
# <environment_context>, the Gemini CLI's <session_context>. Not the request.
_CONTEXT_BLOCK = re.compile(r"<([a-z][a-z0-9]*(?:[_-][a-z0-9]+)+)>[\s\S]*?</\1>\s*")
# The tags alone: what an agent wraps a tool's output in (the Gemini CLI's
# <untrusted_context>), around what the tool said.
_CONTEXT_TAG = re.compile(r"</?[a-z][a-z0-9]*(?:[_-][a-z0-9]+)+>\n?")
_TARGET = r"[`'\"]?([\w./~-]+)[`'\"]?"
_FILE = r"[`'\"]?([\w./~-]*(?:\.\w|/)[\w./~-]*)[`'\"]?"  # a path: an extension or a slash


@dataclass(frozen=True, slots=True)
class Intent:
    """A kind of request: the words that ask for it, the shell command doing it for a
    target, and the dedicated tools a model would rather use (in order) than a shell."""

    name: str
    pattern: re.Pattern[str]
    command: Callable[[str], str]
    tools: tuple[str, ...] = ()
    shell_first: bool = True


INTENTS = (
    Intent("run", re.compile(r"\brun\s+`([^`]+)`", re.I), lambda command: command),
    Intent(
        "read",
        re.compile(
            r"\b(?:show|print|read|open|cat|display)(?:\s+me)?(?:\s+the)?(?:\s+contents?\s+of)?"
            r"(?:\s+(?:file|the\s+file))?\s+" + _FILE,
            re.I,
        ),
        lambda path: f"cat {path}",
        ("Read", "read_file", "view_file", "read"),
        shell_first=False,
    ),
    Intent(
        "search",
        re.compile(r"\b(?:search|grep|look)(?:\s+(?:for|up))?\s+" + _TARGET, re.I),
        lambda pattern: f"grep -rn {pattern} .",
        ("Grep", "grep_search", "search_file_content", "grep"),
        shell_first=False,
    ),
    Intent(
        "list",
        re.compile(
            r"\b(?:list|show|what|which)\b.*\b(?:files?|director(?:y|ies)|folders?|contents)\b"
            r"|\bls\b",
            re.I,
        ),
        lambda _: "ls",
        ("LS", "list_directory", "list_dir"),
    ),
)


def _code_mode(command: str) -> JSON:
    """Codex's code mode: a custom `exec` tool running JavaScript over the nested tools."""
    cmd = orjson.dumps(command).decode()
    return {"input": f"const r = await tools.exec_command({{cmd: {cmd}}});\ntext(r.output);"}


# The shell tools of the agents, in the order a model picks among them, each with how it
# takes a command: Claude Code's Bash, Codex's exec_command / shell_command / shell (an
# argv) / code mode's exec, the Gemini CLI's (and Qwen Code's) run_shell_command, opencode's
# bash.
SHELLS: dict[str, Callable[[str], JSON]] = {
    "Bash": lambda command: {"command": command, "description": f"Run {command}"},
    "exec_command": lambda command: {"cmd": command},
    "shell_command": lambda command: {"command": command},
    "shell": lambda command: {"command": ["bash", "-lc", command]},
    "run_shell_command": lambda command: {"command": command},
    "exec": _code_mode,
    "bash": lambda command: {"command": command},
}
# What a dedicated tool's parameters are called, by what they carry.
_PATH_KEYS = ("file_path", "path", "absolute_path", "dir_path", "filename", "filePath")
_PATTERN_KEYS = ("pattern", "query", "regex")


def request_text(text: str) -> str:
    """The user's own words: the text without the context blocks agents add around it."""
    return _CONTEXT_BLOCK.sub("", text).strip()


def unwrapped(text: str) -> str:
    """A tool's output without the tags its agent wrapped it in."""
    return _CONTEXT_TAG.sub("", text)


def plan(
    text: str, schemas: Mapping[str, Any], placeholder: Placeholder
) -> tuple[str, JSON] | None:
    """The call a plausible model makes for `text` with the tools `schemas` offers (name ->
    JSON schema of its arguments), or None."""
    for intent in INTENTS:
        match = intent.pattern.search(text)
        if match is None:
            continue
        target = next((group for group in match.groups() if group), ".").rstrip(".,;:!?") or "."
        call = _pick(intent, target, schemas, placeholder)
        if call is not None:
            return call
    return None


def _pick(
    intent: Intent, target: str, schemas: Mapping[str, Any], placeholder: Placeholder
) -> tuple[str, JSON] | None:
    command = intent.command(target)
    shell = next(((n, SHELLS[n](command)) for n in SHELLS if n in schemas), None)
    dedicated = next(
        ((n, _arguments(schemas[n], intent, target, placeholder)) for n in intent.tools
         if n in schemas),
        None,
    )  # fmt: skip
    first, second = (shell, dedicated) if intent.shell_first else (dedicated, shell)
    return first or second


def _arguments(schema: Any, intent: Intent, target: str, placeholder: Placeholder) -> JSON:
    """A dedicated tool's arguments: the target under the name its schema gives it, the
    other required parameters as placeholders."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    names = list(properties or {})
    keys = _PATTERN_KEYS if intent.name == "search" else _PATH_KEYS
    args = placeholder(schema)
    args = args if isinstance(args, dict) else {}
    key = next((k for k in keys if k in names), None)
    if key is not None:
        args[key] = target
    return args
