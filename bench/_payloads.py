"""Request bodies for the overhead benchmark, built deterministically (same bytes every run)."""

from __future__ import annotations

from typing import Any

import orjson

MODEL = "bench"
AGENT_TURN_BYTES = 30_000
SYSTEM_PROMPT_BYTES = 2_000
TOOL_ROUNDS = 6  # each round: assistant tool call, tool result, user follow-up (except last)


def tiny(stream: bool) -> bytes:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello in one word."}],
    }
    return _encode(body, stream)


def agent_turn(stream: bool) -> bytes:
    """A coding agent's turn: ~2 KB system prompt, 3 tools, ~20 messages, ~30 KB in all."""
    body = _agent_body(pad=0)
    missing = AGENT_TURN_BYTES - len(_encode(body, stream))
    body = _agent_body(pad=max(0, missing) // TOOL_ROUNDS)
    return _encode(body, stream)


def _encode(body: dict[str, Any], stream: bool) -> bytes:
    return orjson.dumps({**body, "stream": True} if stream else body)


def _agent_body(pad: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _system_prompt()},
        {"role": "user", "content": "The tests in tests/test_parser.py fail. Find and fix it."},
    ]
    for turn in range(TOOL_ROUNDS):
        name, arguments = _TOOL_CALLS[turn % len(_TOOL_CALLS)]
        call_id = f"call_{turn:04d}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": _tool_output(turn, 1500 + pad)}
        )
        if turn < TOOL_ROUNDS - 1:
            messages.append({"role": "user", "content": f"Keep going; step {turn + 2} next."})
    return {"model": MODEL, "messages": messages, "tools": _TOOLS, "temperature": 0.2}


def _system_prompt() -> str:
    rules = [
        "You are a careful software engineering agent working in a git repository.",
        "Read files before changing them and keep every change minimal and focused.",
        "Run the test suite after each change and report exactly what you observed.",
        "Never invent file contents; use the read_file tool to see them.",
        "Prefer small, reviewable diffs over sweeping rewrites of working code.",
    ]
    text = ""
    rule = 0
    while len(text) < SYSTEM_PROMPT_BYTES:
        text += f"{rule + 1}. {rules[rule % len(rules)]}\n"
        rule += 1
    return text[:SYSTEM_PROMPT_BYTES]


def _tool_output(turn: int, size: int) -> str:
    lines = []
    total = 0
    line_no = 0
    while total < size:
        line = f"{line_no + 1:4d}  def helper_{turn}_{line_no}(value): return value * {line_no}\n"
        lines.append(line)
        total += len(line)
        line_no += 1
    return "".join(lines)[:size]


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
                "additionalProperties": False,
            },
        },
    }


_TOOLS = [
    _function(
        "read_file",
        "Read a text file from the repository and return its numbered lines.",
        {
            "path": {"type": "string", "description": "Path relative to the repository root."},
            "start_line": {"type": "integer", "description": "First line to return, from 1."},
        },
    ),
    _function(
        "run_shell",
        "Run a shell command in the repository and return its exit code and output.",
        {
            "command": {"type": "string", "description": "The command line to run."},
            "timeout_s": {"type": "number", "description": "Seconds before it is killed."},
        },
    ),
    _function(
        "search_code",
        "Search the repository for a regular expression and return matching lines.",
        {
            "pattern": {"type": "string", "description": "A regular expression."},
            "glob": {"type": "string", "description": "Only files matching this glob."},
        },
    ),
]

_TOOL_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("read_file", {"path": "tests/test_parser.py", "start_line": 1}),
    ("run_shell", {"command": "python -m pytest tests/test_parser.py -x -q", "timeout_s": 120}),
    ("search_code", {"pattern": "def parse_", "glob": "src/**/*.py"}),
    ("read_file", {"path": "src/parser.py", "start_line": 40}),
]


def string_tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    """A tool schema whose parameters are all required strings (`properties`: name → what)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    k: {"type": "string", "description": v} for k, v in properties.items()
                },
                "required": list(properties),
            },
        },
    }
