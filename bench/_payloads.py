"""Request bodies for the overhead benchmark, built deterministically (same bytes every run)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
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


GEMINI_MODEL = "gemini-bench"
_GEMINI_SIGNATURE_BYTES = 300  # a function call's opaque thoughtSignature, base64 like Google's


@functools.cache
def gemini_turn(stream: bool) -> bytes:
    """The agent turn as Gemini's `generateContent` body (what Gemini CLI sends), ~30 KB:
    `systemInstruction`, the conversation as `contents` of user and model turns, each call a
    `functionCall` part (the first with its `thoughtSignature`) answered by a user
    `functionResponse` part, the tools as `functionDeclarations`, a `generationConfig`. The
    same bytes streamed or not: the path's action says which (no `stream` field)."""
    slots = TOOL_ROUNDS
    return _padded(lambda pad: orjson.dumps(_gemini_body(pad)), AGENT_TURN_BYTES, slots)


def _gemini_body(pad: int) -> dict[str, Any]:
    rng = random.Random(AGENT_TURN_BYTES)  # the signatures: the same for every pad
    contents: list[dict[str, Any]] = [
        {"role": "user", "parts": [{"text": "The tests in tests/test_parser.py fail. Fix it."}]}
    ]
    for turn in range(TOOL_ROUNDS):
        name, arguments = _TOOL_CALLS[turn % len(_TOOL_CALLS)]
        call = {"functionCall": {"name": name, "args": arguments}}
        signature = "".join(rng.choice(_BASE64) for _ in range(_GEMINI_SIGNATURE_BYTES))
        contents.append({"role": "model", "parts": [{**call, "thoughtSignature": signature}]})
        output = {"output": _tool_output(turn, 1500 + pad)}
        contents.append(
            {"role": "user", "parts": [{"functionResponse": {"name": name, "response": output}}]}
        )
        if turn < TOOL_ROUNDS - 1:
            contents.append({"role": "user", "parts": [{"text": f"Keep going; step {turn + 2}."}]})
    declarations = [
        {k: tool["function"][k] for k in ("name", "description")}
        | {"parametersJsonSchema": tool["function"]["parameters"]}
        for tool in _TOOLS
    ]
    return {
        "contents": contents,
        "systemInstruction": {"role": "user", "parts": [{"text": _system_prompt()}]},
        "tools": [{"functionDeclarations": declarations}],
        "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
        "generationConfig": {"temperature": 0.2, "thinkingConfig": {"includeThoughts": True}},
    }


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


# --- Claude Code ---------------------------------------------------------------------------
#
# A mid-task turn of Claude Code, as it POSTs to /v1/messages: three system blocks (two cached),
# 24 tools, a ~20-message history of thinking, text, tool_use and tool_result blocks with a
# mid-conversation system message, the newest block cached; ~77 KB. `claude_code_chat_turn` is
# the same conversation as a Chat Completions request, padded to the same size.

CLAUDE_MODEL = "claude-bench"
CLAUDE_CODE_BYTES = 77_000
CLAUDE_CODE_SEED = 77
CACHED = {"type": "ephemeral"}
_ROOT = "/home/dev/parsekit"
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_BASE64 = _BASE62 + "+/"


@functools.cache
def claude_code_turn(stream: bool) -> bytes:
    """A Claude Code turn for POST /v1/messages, ~77 KB, the same bytes every run."""
    return _padded(lambda pad: _encode(_claude_code_body(pad), stream), CLAUDE_CODE_BYTES)


@functools.cache
def claude_code_chat_turn(stream: bool) -> bytes:
    """The same conversation as a Chat Completions request, as many bytes as the Anthropic one
    (system blocks joined, thinking dropped, tool results as `tool` messages)."""
    size = len(claude_code_turn(stream))
    return _padded(lambda pad: _encode(_as_chat(_claude_code_body(pad)), stream), size)


def _padded(build: Callable[[int], bytes], size: int, padded: int | None = None) -> bytes:
    """`build(pad)` with the pad (characters added to each of the `padded` tool results, by
    default the Claude Code turn's) that comes closest to `size` bytes from below."""
    slots = _PADDED_RESULTS if padded is None else padded
    pad = 0
    body = build(pad)
    for _ in range(8):
        missing = size - len(body)
        if 0 <= missing < slots:
            break
        pad = max(0, pad + missing // slots)
        body = build(pad)
    return body


def _claude_code_body(pad: int) -> dict[str, Any]:
    rng = random.Random(CLAUDE_CODE_SEED)  # ids and signatures: the same for every pad
    session = "-".join(
        "".join(rng.choice("0123456789abcdef") for _ in range(n)) for n in (8, 4, 4, 4, 12)
    )
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": _CLAUDE_MD},
                {"type": "text", "text": _TASK},
            ],
        }
    ]
    for step, (thought, say, calls, extra) in enumerate(_SCRIPT):
        ids = [_tool_id(rng) for _ in calls]
        assistant: list[dict[str, Any]] = [
            {"type": "thinking", "thinking": thought, "signature": _signature(rng)}
        ]
        if say:
            assistant.append({"type": "text", "text": say})
        assistant += [
            {"type": "tool_use", "id": i, "name": name, "input": arguments}
            for i, (name, arguments, _) in zip(ids, calls, strict=True)
        ]
        messages.append({"role": "assistant", "content": assistant})
        results: list[dict[str, Any]] = [
            _tool_result(i, output, pad, step) for i, (_, _, output) in zip(ids, calls, strict=True)
        ]
        if extra:
            results.append({"type": "text", "text": extra})
        messages.append({"role": "user", "content": results})
        if step == _SYSTEM_AFTER_STEP:
            messages.append({"role": "system", "content": _MID_SYSTEM})
    messages[-1]["content"][-1]["cache_control"] = CACHED
    return {
        "model": CLAUDE_MODEL,
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": _IDENTITY, "cache_control": CACHED},
            {"type": "text", "text": _INSTRUCTIONS, "cache_control": CACHED},
            {"type": "text", "text": _ENVIRONMENT},
        ],
        "tools": _CLAUDE_TOOLS,
        "messages": messages,
        "metadata": {"user_id": orjson.dumps({"session_id": session}).decode()},
        "thinking": {"type": "adaptive"},
    }


def _tool_id(rng: random.Random) -> str:
    return "toolu_01" + "".join(rng.choice(_BASE62) for _ in range(22))


def _signature(rng: random.Random) -> str:
    return "".join(rng.choice(_BASE64) for _ in range(rng.randrange(380, 620))) + "=="


def _tool_result(tool_use_id: str, output: Output, pad: int, step: int) -> dict[str, Any]:
    """`output`: fixed text, or (kind, name, size) for a generated file listing or log."""
    if isinstance(output, str):
        text = output
    else:
        kind, name, size = output
        text = (_numbered if kind == "read" else _test_log)(name, size + pad, step)
    if step % 3 == 2:  # some clients send a result as a list of text blocks
        return {"type": "tool_result", "tool_use_id": tool_use_id, "content": [_block(text)]}
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}


def _block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _numbered(path: str, size: int, step: int) -> str:
    """A file as the Read tool shows it: right-aligned line numbers, an arrow, the line."""
    out, total, n = [], 0, 0
    while total < size:
        code = _CODE[(n + step * 7) % len(_CODE)].format(n=n, step=step, path=path)
        line = f"{n + 1:>6}→{code}\n"
        out.append(line)
        total += len(line)
        n += 1
    return "".join(out)[:size]


def _test_log(name: str, size: int, step: int) -> str:
    head = (
        "============================= test session starts ==============================\n"
        "platform linux -- Python 3.12.3, pytest-8.3.2, pluggy-1.5.0\n"
        f"rootdir: {_ROOT}\nconfigfile: pyproject.toml\nplugins: cov-5.0.0, xdist-3.6.1\n"
        f"collected {40 + step} items\n\n"
    )
    out, total, n = [head], len(head), 0
    while total < size:
        status = "FAILED" if (n + step) % 11 == 0 else "PASSED"
        line = f"tests/{name}::test_case_{step}_{n:03d}[input{n % 7}] {status} [{n % 100:>3}%]\n"
        out.append(line)
        total += len(line)
        n += 1
    return "".join(out)[:size]


def _as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions request a chat client would send for the same conversation."""
    system = "\n\n".join(block["text"] for block in body["system"])
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            messages.append({"role": message["role"], "content": content})
        elif message["role"] == "assistant":
            text = "\n".join(b["text"] for b in content if b["type"] == "text")
            calls = [
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": orjson.dumps(b["input"]).decode()},
                }
                for b in content
                if b["type"] == "tool_use"
            ]
            messages.append({"role": "assistant", "content": text or None, "tool_calls": calls})
        else:
            for block in content:
                if block["type"] == "tool_result":
                    result = block["content"]
                    if not isinstance(result, str):
                        result = "\n".join(b["text"] for b in result)
                    messages.append(
                        {"role": "tool", "tool_call_id": block["tool_use_id"], "content": result}
                    )
            texts = [_block(b["text"]) for b in content if b["type"] == "text"]
            if texts:
                messages.append({"role": "user", "content": texts})
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["input_schema"],
            },
        }
        for t in body["tools"]
    ]
    return {
        "model": MODEL,
        "max_tokens": body["max_tokens"],
        "messages": messages,
        "tools": tools,
        "user": body["metadata"]["user_id"],
    }


Output = str | tuple[str, str, int]  # fixed text, or ("read" | "log", name, characters)
Call = tuple[str, dict[str, Any], Output]  # tool name, input, what it returned

_IDENTITY = "You are Claude Code, Anthropic's official CLI for Claude."

_INSTRUCTIONS_PARTS = [
    (
        "Tone and style",
        "Be concise, direct and to the point. Answer in fewer than four lines unless the user "
        "asks for detail; one-word answers are best when they suffice. Do not add preamble or "
        "postamble such as explaining your code or summarizing your action unless asked. Your "
        "output is shown in a terminal and rendered as GitHub-flavored markdown in a monospace "
        "font. Only use emojis if the user explicitly asks for them.",
    ),
    (
        "Proactiveness",
        "Do what was asked, nothing more and nothing less. When the user asks how to approach "
        "something, answer the question first instead of jumping into actions. Never create "
        "files unless they are necessary to reach the goal; always prefer editing an existing "
        "file to creating a new one. Never proactively create documentation files.",
    ),
    (
        "Following conventions",
        "When making changes to files, first understand the file's code conventions. Mimic the "
        "code style, use existing libraries and utilities, and follow existing patterns. Never "
        "assume that a given library is available, even if it is well known: check that this "
        "codebase already uses it (neighbouring files, package.json, pyproject.toml, cargo.toml "
        "and so on). When you create a new component, look at existing components first. When "
        "you edit a piece of code, look at its surrounding context, especially its imports, to "
        "understand the frameworks and libraries it uses, and make the change in the most "
        "idiomatic way. Always follow security best practices; never introduce code that "
        "exposes or logs secrets and keys, and never commit secrets to the repository.",
    ),
    (
        "Code style",
        "Do not add comments to the code you write unless the user asks for them or the code "
        "is complex and needs additional context.",
    ),
    (
        "Task management",
        "You have access to the TodoWrite tool to help you manage and plan tasks. Use it very "
        "frequently to make sure you track your tasks and give the user visibility into your "
        "progress. It is also extremely helpful for planning and for breaking larger complex "
        "tasks down into smaller steps. Mark todos as completed as soon as you are done with a "
        "task; do not batch up several tasks before marking them as completed.",
    ),
    (
        "Doing tasks",
        "The user will primarily ask you to perform software engineering tasks: solving bugs, "
        "adding functionality, refactoring code, explaining code and more. For these tasks: "
        "plan the task with TodoWrite if it is required; use the search tools extensively, in "
        "parallel and sequentially, to understand the codebase and the query; implement the "
        "solution using all tools available to you; verify the solution with tests where "
        "possible, never assuming a specific test framework or script but checking the README "
        "or searching the codebase for the testing approach. When you have completed a task, "
        "you MUST run the lint and typecheck commands (for example npm run lint, ruff, mypy) "
        "if they were provided to you, to ensure your code is correct. NEVER commit changes "
        "unless the user explicitly asks you to.",
    ),
    (
        "Tool usage policy",
        "When doing file search, prefer the Task tool to reduce context usage. You can call "
        "multiple tools in a single response: when multiple independent pieces of information "
        "are requested, batch your tool calls together for optimal performance. When making "
        "multiple bash calls, send a single message with several tool calls to run them in "
        "parallel. Use specialized tools instead of bash commands when possible: Read for "
        "reading files instead of cat, head or tail; Edit for editing instead of sed or awk; "
        "Write for creating files instead of echo redirection or heredocs; Grep and Glob for "
        "searching instead of grep, rg or find. Reserve bash for system commands and terminal "
        "operations that require shell execution.",
    ),
    (
        "Code references",
        "When referencing specific functions or pieces of code, include the pattern "
        "file_path:line_number so that the user can easily navigate to the source location, "
        "for example: clients are marked as failed in the connect function in "
        "src/services/process.ts:712.",
    ),
    (
        "Git safety",
        "Never update the git config. Never run destructive or irreversible git commands such "
        "as push --force or hard reset unless the user explicitly requests them. Never skip "
        "hooks (--no-verify) unless asked. Avoid git commit --amend. Before committing, run "
        "git status, git diff and git log in parallel to see untracked files, staged and "
        "unstaged changes and the repository's commit message style; draft a concise message "
        "that focuses on why rather than what, and do not commit files that likely contain "
        "secrets (.env, credentials.json). If the commit fails because of pre-commit hook "
        "changes, retry once to include them.",
    ),
    (
        "Security",
        "Assist with defensive security tasks only. Refuse to create, modify or improve code "
        "that may be used maliciously. Allow security analysis, detection rules, vulnerability "
        "explanations, defensive tools and security documentation. Never generate or guess "
        "URLs for the user unless you are confident that they help the user with programming.",
    ),
]
_INSTRUCTIONS = (
    "You are an interactive CLI tool that helps users with software engineering tasks. Use "
    "the instructions below and the tools available to you to assist the user.\n\n"
    + "\n\n".join(f"# {title}\n{text}" for title, text in _INSTRUCTIONS_PARTS * 2)
)
_ENVIRONMENT = (
    "Here is useful information about the environment you are running in:\n<env>\n"
    f"Working directory: {_ROOT}\nIs directory a git repo: Yes\nPlatform: linux\n"
    "OS Version: Linux 6.8.0-45-generic\nToday's date: 2025-10-14\n</env>\n"
    "You are powered by the model named Sonnet 4.5.\n\n"
    "gitStatus: This is the git status at the start of the conversation.\n"
    "Current branch: fix/tokenizer-offsets\n\nMain branch (you will usually use this for PRs): "
    "main\n\nStatus:\nM src/parsekit/tokenizer.py\n?? notes/offsets.md\n\nRecent commits:\n"
    "a41c9e2 Tokenizer: one pass over the input, offsets kept per token\n"
    "77d01b3 Parser: report the column of an unexpected token\n"
    "f3b2a90 CI: run the tests on Python 3.13 too\n"
    "0c9d4e1 Docs: the grammar of string literals\n"
)

_CLAUDE_MD = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
    "# claudeMd\nCodebase and user instructions are shown below. Be sure to adhere to these "
    "instructions. IMPORTANT: These instructions OVERRIDE any default behavior and you MUST "
    "follow them exactly as written.\n\n"
    f"Contents of {_ROOT}/CLAUDE.md (project instructions, checked into the codebase):\n\n"
    "# parsekit\n\nA small parser-combinator library with a hand-written tokenizer.\n\n"
    "## Commands\n- Tests: `uv run pytest -q` (a single test: `uv run pytest -q tests/x.py::name`)"
    "\n- Lint: `uv run ruff check . && uv run ruff format --check .`\n- Types: `uv run mypy`\n\n"
    "## Conventions\n- Python 3.12, type hints everywhere, `from __future__ import annotations`."
    "\n- Tokens carry `(start, end)` offsets into the source; never line/column pairs.\n"
    "- Public names are re-exported from `parsekit/__init__.py`; keep `__all__` sorted.\n"
    "- Every bug fix comes with a regression test in the matching `tests/test_<module>.py`.\n"
    "\n      IMPORTANT: this context may or may not be relevant to your tasks. You should not "
    "respond to this context unless it is highly relevant to your task.\n</system-reminder>\n"
)
_TASK = (
    "tests/test_tokenizer.py started failing after the last commit (the one-pass tokenizer). "
    "Find out why and fix it; keep the one-pass design."
)
_MID_SYSTEM = (
    "<system-reminder>\nThe user opened the file src/parsekit/tokenizer.py in the IDE. This "
    "may or may not be related to the current task.\n</system-reminder>"
)

_CODE = [
    "from __future__ import annotations",
    "",
    "import re",
    "from dataclasses import dataclass",
    "",
    "",
    "@dataclass(frozen=True, slots=True)",
    "class Token{step}_{n}:",
    '    """One token of {path}: its kind, its text and where it sits in the source."""',
    "",
    "    kind: str",
    "    text: str",
    "    start: int",
    "    end: int",
    "",
    "    def __len__(self) -> int:",
    "        return self.end - self.start",
    "",
    "",
    "def scan_{n}(source: str, position: int = 0) -> list[Token{step}_{n}]:",
    "    tokens: list[Token{step}_{n}] = []",
    "    while position < len(source):",
    "        match = _PATTERN.match(source, position)",
    "        if match is None:",
    '            raise SyntaxError(f"unexpected character at offset {{position}}")',
    "        kind = match.lastgroup or 'error'",
    "        if kind != 'space':",
    "            tokens.append(Token{step}_{n}(kind, match.group(), position, match.end()))",
    "        position = match.end()",
    "    return tokens",
    "",
]

_SCRIPT: list[tuple[str, str, list[Call], str]] = [
    (
        "The user says the tokenizer tests fail since the one-pass rewrite. First I should see "
        "the failure itself before reading any code, so run just that test file.",
        "I'll start by running the failing tests to see what breaks.",
        [
            (
                "Bash",
                {
                    "command": "uv run pytest -q tests/test_tokenizer.py",
                    "description": "Run the failing tokenizer tests",
                },
                ("log", "test_tokenizer.py", 2600),
            )
        ],
        "",
    ),
    (
        "Several offset assertions fail, all on inputs with string literals containing escaped "
        "quotes. The end offset looks one short. Read the tokenizer to see how strings are "
        "scanned in the new single pass.",
        "",
        [
            (
                "Read",
                {"file_path": f"{_ROOT}/src/parsekit/tokenizer.py"},
                ("read", "src/parsekit/tokenizer.py", 4200),
            )
        ],
        "",
    ),
    (
        "The string pattern consumes the escape but the offset bookkeeping uses the unescaped "
        "length. I need every caller of the token offsets, and the tests that cover them.",
        "The string branch computes `end` from the unescaped text. Let me find who relies on it.",
        [
            (
                "Grep",
                {
                    "pattern": r"\.end\b|\.start\b",
                    "path": "src",
                    "output_mode": "content",
                    "-n": True,
                },
                ("read", "grep: src", 1800),
            ),
            (
                "Glob",
                {"pattern": "tests/**/test_*.py"},
                "\n".join(
                    f"{_ROOT}/tests/test_{name}.py"
                    for name in ("tokenizer", "parser", "combinators", "errors", "positions", "cli")
                ),
            ),
        ],
        "",
    ),
    (
        "Three things to do: fix the offset, add a regression test, run lint and types. Track "
        "them so the user sees progress.",
        "",
        [
            (
                "TodoWrite",
                {
                    "todos": [
                        {
                            "content": "Fix string token end offsets with escapes",
                            "status": "in_progress",
                            "activeForm": "Fixing string token end offsets",
                        },
                        {
                            "content": "Add a regression test for escaped quotes",
                            "status": "pending",
                            "activeForm": "Adding a regression test",
                        },
                        {
                            "content": "Run tests, ruff and mypy",
                            "status": "pending",
                            "activeForm": "Running tests, ruff and mypy",
                        },
                    ]
                },
                "Todos have been modified successfully. Ensure that you continue to use the todo "
                "list to track your progress. Please proceed with the current tasks if "
                "applicable",
            )
        ],
        "",
    ),
    (
        "Before editing, read the failing tests to see exactly which offsets they expect for "
        "escaped quotes and for unicode escapes.",
        "",
        [
            (
                "Read",
                {"file_path": f"{_ROOT}/tests/test_tokenizer.py", "offset": 1, "limit": 200},
                ("read", "tests/test_tokenizer.py", 3600),
            )
        ],
        "",
    ),
    (
        "The tests expect end to be the index just past the closing quote in the source, "
        "independent of escapes. The fix is to take match.end() rather than start + len(value).",
        "The bug: `end = start + len(value)` uses the decoded value. Fixing it to use the match.",
        [
            (
                "Edit",
                {
                    "file_path": f"{_ROOT}/src/parsekit/tokenizer.py",
                    "old_string": "            value = _unescape(match.group('string'))\n"
                    "            tokens.append(Token('string', value, start, start + len(value)))",
                    "new_string": "            value = _unescape(match.group('string'))\n"
                    "            tokens.append(Token('string', value, start, match.end()))",
                },
                ("read", "src/parsekit/tokenizer.py (edited)", 1400),
            )
        ],
        "",
    ),
    (
        "Run the tokenizer tests again to confirm the fix before adding the regression test.",
        "",
        [
            (
                "Bash",
                {
                    "command": "uv run pytest -q tests/test_tokenizer.py",
                    "description": "Re-run the tokenizer tests",
                },
                ("log", "test_tokenizer.py", 2400),
            )
        ],
        "Also keep the old `Token.stop` name working as an alias of `end`; the CLI still uses it.",
    ),
    (
        "The user wants Token.stop kept as an alias. Find where stop is still used so the alias "
        "covers every caller, including the CLI module.",
        "Sure. Let me find every use of `.stop` first.",
        [
            (
                "Grep",
                {"pattern": r"\.stop\b", "path": ".", "output_mode": "content", "-n": True},
                ("read", "grep: .stop", 1200),
            )
        ],
        "",
    ),
    (
        "Only the CLI and one test use .stop. A read-only property on the dataclass is enough; "
        "add it next to __len__ and write the regression test in the same step.",
        "",
        [
            (
                "Edit",
                {
                    "file_path": f"{_ROOT}/src/parsekit/tokenizer.py",
                    "old_string": "    def __len__(self) -> int:\n"
                    "        return self.end - self.start",
                    "new_string": "    def __len__(self) -> int:\n"
                    "        return self.end - self.start\n\n"
                    "    @property\n    def stop(self) -> int:\n"
                    '        """Deprecated name of `end`."""\n        return self.end',
                },
                ("read", "src/parsekit/tokenizer.py (edited)", 1200),
            ),
            (
                "Edit",
                {
                    "file_path": f"{_ROOT}/tests/test_tokenizer.py",
                    "old_string": "def test_string_offsets():",
                    "new_string": "def test_escaped_quote_end_offset():\n"
                    '    (token,) = tokenize(r\'"a\\\\"b"\')\n'
                    "    assert (token.start, token.end) == (0, 6)\n\n\n"
                    "def test_string_offsets():",
                },
                "The file tests/test_tokenizer.py has been updated successfully.",
            ),
        ],
        "",
    ),
    (
        "Now the whole suite, then ruff and mypy as CLAUDE.md asks, in parallel.",
        "Running the full suite, lint and type checks.",
        [
            (
                "Bash",
                {"command": "uv run pytest -q", "description": "Run the whole test suite"},
                ("log", "test_parser.py", 2800),
            ),
            (
                "Bash",
                {
                    "command": "uv run ruff check . && uv run ruff format --check . && uv run mypy",
                    "description": "Lint and type-check",
                },
                "All checks passed!\n41 files already formatted\nSuccess: no issues found in 41 "
                "source files",
            ),
        ],
        "",
    ),
]
_SYSTEM_AFTER_STEP = 4  # the mid-conversation system message comes after this step's results
_PADDED_RESULTS = sum(
    not isinstance(output, str) for _, _, calls, _ in _SCRIPT for *_, output in calls
)


def _claude_tool(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "input_schema": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        },
    }


def _s(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _n(description: str) -> dict[str, Any]:
    return {"type": "number", "description": description}


def _b(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


_CLAUDE_TOOLS = [
    _claude_tool(
        "Task",
        "Launch a new agent to handle complex, multi-step tasks autonomously. Available agent "
        "types: general-purpose (research, code search, multi-step tasks; all tools), "
        "statusline-setup and output-style-setup. When you are searching for a keyword or file "
        "and are not confident you will find the right match in the first few tries, use this "
        "tool. Launch several agents concurrently whenever possible; each agent's result is "
        "not visible to the user, so summarize it for them.",
        {
            "description": _s("A short (3-5 word) description of the task"),
            "prompt": _s("The task for the agent to perform"),
            "subagent_type": _s("The type of specialized agent to use for this task"),
        },
        ["description", "prompt", "subagent_type"],
    ),
    _claude_tool(
        "Bash",
        "Executes a given bash command in a persistent shell session with an optional timeout, "
        "ensuring proper handling and security measures. Before running a command that creates "
        "directories or files, verify the parent directory exists. Always quote file paths "
        "that contain spaces. Output over 30000 characters is truncated. Avoid find, grep, cat, "
        "head, tail, sed, awk and echo: use the dedicated tools. Chain dependent commands with "
        "&&; send independent commands as parallel tool calls.",
        {
            "command": _s("The command to execute"),
            "timeout": _n("Optional timeout in milliseconds (max 600000)"),
            "description": _s(
                "Clear, concise description of what this command does in 5-10 words, in "
                "active voice."
            ),
            "run_in_background": _b(
                "Set to true to run this command in the background. Use BashOutput to read "
                "the output later."
            ),
        },
        ["command"],
    ),
    _claude_tool(
        "Glob",
        "Fast file pattern matching tool that works with any codebase size. Supports glob "
        'patterns like "**/*.js" or "src/**/*.ts" and returns matching file paths sorted by '
        "modification time. Use this tool when you need to find files by name patterns. When "
        "you are doing an open-ended search that may require multiple rounds of globbing and "
        "grepping, use the Task tool instead. Batch several searches in one response.",
        {
            "pattern": _s("The glob pattern to match files against"),
            "path": _s(
                "The directory to search in. If not specified, the current working directory "
                "will be used. Omit this field to use the default directory."
            ),
        },
        ["pattern"],
    ),
    _claude_tool(
        "Grep",
        "A powerful search tool built on ripgrep. ALWAYS use Grep for search tasks; never "
        'invoke grep or rg as a Bash command. Supports full regex syntax (e.g. "log.*Error", '
        '"function\\s+\\w+"), filtering files with the glob or type parameters, and output '
        "modes: content shows matching lines, files_with_matches shows only file paths (the "
        "default), count shows match counts. Patterns match within single lines unless "
        "multiline is set.",
        {
            "pattern": _s("The regular expression pattern to search for in file contents"),
            "path": _s("File or directory to search in. Defaults to the working directory."),
            "glob": _s('Glob pattern to filter files (e.g. "*.js", "*.{ts,tsx}")'),
            "output_mode": {
                "type": "string",
                "enum": ["content", "files_with_matches", "count"],
                "description": 'Output mode. Defaults to "files_with_matches".',
            },
            "-B": _n("Number of lines to show before each match (content mode only)"),
            "-A": _n("Number of lines to show after each match (content mode only)"),
            "-C": _n("Number of lines to show before and after each match"),
            "-n": _b("Show line numbers in output (content mode only)"),
            "-i": _b("Case insensitive search"),
            "type": _s("File type to search (rg --type), e.g. js, py, rust, go, java"),
            "head_limit": _n("Limit output to the first N lines or entries"),
            "multiline": _b("Enable multiline mode where . matches newlines. Default: false."),
        },
        ["pattern"],
    ),
    _claude_tool(
        "ExitPlanMode",
        "Use this tool when you are in plan mode and have finished presenting your plan and "
        "are ready to code. This will prompt the user to exit plan mode. Only use it when the "
        "task requires planning the implementation steps of a task that requires writing "
        "code; for research tasks where you gather information, search files or read files, "
        "do not use this tool.",
        {"plan": _s("The plan you came up with, that you want to run by the user for approval.")},
        ["plan"],
    ),
    _claude_tool(
        "Read",
        "Reads a file from the local filesystem. The file_path parameter must be an absolute "
        "path. By default it reads up to 2000 lines from the beginning of the file; you can "
        "optionally specify a line offset and limit for long files. Lines longer than 2000 "
        "characters are truncated. Results are returned in cat -n format, with line numbers "
        "starting at 1. This tool can read images, PDFs and Jupyter notebooks. Read several "
        "potentially useful files in parallel when you can.",
        {
            "file_path": _s("The absolute path to the file to read"),
            "offset": _n("The line number to start reading from. Only for large files."),
            "limit": _n("The number of lines to read. Only for files too large to read at once."),
        },
        ["file_path"],
    ),
    _claude_tool(
        "Edit",
        "Performs exact string replacements in files. You must use the Read tool at least once "
        "in the conversation before editing. When editing text from Read output, preserve the "
        "exact indentation as it appears after the line number prefix; never include any part "
        "of the prefix in old_string or new_string. The edit fails if old_string is not unique "
        "in the file: give more surrounding context, or use replace_all to change every "
        "instance.",
        {
            "file_path": _s("The absolute path to the file to modify"),
            "old_string": _s("The text to replace"),
            "new_string": _s("The text to replace it with (must differ from old_string)"),
            "replace_all": {
                "type": "boolean",
                "default": False,
                "description": "Replace all occurrences of old_string (default false)",
            },
        },
        ["file_path", "old_string", "new_string"],
    ),
    _claude_tool(
        "MultiEdit",
        "Makes multiple edits to a single file in one operation, built on top of Edit. Prefer "
        "it over Edit when you need several edits to the same file. The edits are applied in "
        "sequence, each to the result of the previous one, and atomically: if any edit fails, "
        "none is applied. Plan your edits so that earlier edits do not change the text that "
        "later edits are trying to find.",
        {
            "file_path": _s("The absolute path to the file to modify"),
            "edits": {
                "type": "array",
                "minItems": 1,
                "description": "Array of edit operations to perform sequentially on the file",
                "items": {
                    "type": "object",
                    "properties": {
                        "old_string": _s("The text to replace"),
                        "new_string": _s("The text to replace it with"),
                        "replace_all": {"type": "boolean", "default": False},
                    },
                    "required": ["old_string", "new_string"],
                    "additionalProperties": False,
                },
            },
        },
        ["file_path", "edits"],
    ),
    _claude_tool(
        "Write",
        "Writes a file to the local filesystem, overwriting the existing file if there is one. "
        "If this is an existing file, you MUST use the Read tool first to read its contents, "
        "or this tool will fail. ALWAYS prefer editing existing files in the codebase; never "
        "write new files unless explicitly required, and never proactively create "
        "documentation files (*.md) or README files.",
        {
            "file_path": _s("The absolute path to the file to write (must be absolute)"),
            "content": _s("The content to write to the file"),
        },
        ["file_path", "content"],
    ),
    _claude_tool(
        "NotebookEdit",
        "Completely replaces the contents of a specific cell in a Jupyter notebook (.ipynb "
        "file) with new source. Jupyter notebooks are interactive documents that combine "
        "code, text and visualizations. The notebook_path must be absolute. The cell_id "
        "identifies the cell; use edit_mode=insert to add a new cell after it and "
        "edit_mode=delete to remove it.",
        {
            "notebook_path": _s("The absolute path to the Jupyter notebook file to edit"),
            "cell_id": _s("The ID of the cell to edit"),
            "new_source": _s("The new source for the cell"),
            "cell_type": {"type": "string", "enum": ["code", "markdown"]},
            "edit_mode": {"type": "string", "enum": ["replace", "insert", "delete"]},
        },
        ["notebook_path", "new_source"],
    ),
    _claude_tool(
        "WebFetch",
        "Fetches content from a specified URL and processes it using an AI model: it takes a "
        "URL and a prompt, fetches the URL content, converts HTML to markdown and answers the "
        "prompt about it with a small, fast model. Use it when you need to retrieve and "
        "analyze web content. HTTP URLs are upgraded to HTTPS. Results may be summarized if "
        "the content is very large; a 15-minute cache makes repeated access faster.",
        {
            "url": {"type": "string", "format": "uri", "description": "The URL to fetch"},
            "prompt": _s("The prompt to run on the fetched content"),
        },
        ["url", "prompt"],
    ),
    _claude_tool(
        "TodoWrite",
        "Use this tool to create and manage a structured task list for your current coding "
        "session. It helps you track progress, organize complex tasks and demonstrate "
        "thoroughness to the user. Use it for complex multi-step tasks, when the user gives "
        "a list of things to do, and right after receiving new instructions. Exactly one task "
        "should be in_progress at any time; mark tasks completed immediately after finishing.",
        {
            "todos": {
                "type": "array",
                "description": "The updated todo list",
                "items": {
                    "type": "object",
                    "properties": {
                        "content": {"type": "string", "minLength": 1},
                        "status": {
                            "type": "string",
                            "enum": ["pending", "in_progress", "completed"],
                        },
                        "activeForm": {"type": "string", "minLength": 1},
                    },
                    "required": ["content", "status", "activeForm"],
                    "additionalProperties": False,
                },
            }
        },
        ["todos"],
    ),
    _claude_tool(
        "WebSearch",
        "Allows Claude to search the web and use the results to inform responses. Provides "
        "up-to-date information for current events and recent data, returned as search result "
        "blocks. Use it for information beyond the knowledge cutoff. Domain filtering is "
        "supported to include or block specific websites. Web search is only available in "
        "the US. Account for today's date when searching for recent documentation.",
        {
            "query": {"type": "string", "minLength": 2, "description": "The search query"},
            "allowed_domains": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Only include search results from these domains",
            },
            "blocked_domains": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Never include search results from these domains",
            },
        },
        ["query"],
    ),
    _claude_tool(
        "BashOutput",
        "Retrieves output from a running or completed background bash shell. Takes a shell_id "
        "identifying the shell and always returns only new output since the last check, along "
        "with the shell's status (running, completed, killed). Supports optional regex "
        "filtering to show only lines matching a pattern. Use this tool when you need to "
        "monitor or check the output of a long-running shell.",
        {
            "bash_id": _s("The ID of the background shell to retrieve output from"),
            "filter": _s(
                "Optional regular expression to filter the output lines. Only lines matching "
                "this regex are included; the others are no longer available to read."
            ),
        },
        ["bash_id"],
    ),
    _claude_tool(
        "KillShell",
        "Kills a running background bash shell by its ID. Takes a shell_id parameter "
        "identifying the shell to kill and returns a success or failure status. Use this tool "
        "when you need to terminate a long-running shell, for example a development server "
        "or a watcher started with run_in_background. Shell IDs can be found with the "
        "/bashes command.",
        {"shell_id": _s("The ID of the background shell to kill")},
        ["shell_id"],
    ),
    _claude_tool(
        "SlashCommand",
        "Execute a slash command within the main conversation. When you use this tool, the "
        "slash command gets expanded to a full prompt that provides detailed instructions on "
        "how to complete the task. Only custom slash commands that appear in the available "
        "commands list can be used; do not use it for built-in CLI commands such as /help or "
        "/clear, and never invoke a command that is already running.",
        {"command": _s('The slash command to execute with its arguments, e.g. "/review-pr 123"')},
        ["command"],
    ),
    _claude_tool(
        "Skill",
        "Execute a skill within the main conversation. Skills provide specialized capabilities "
        "and domain knowledge. When users ask you to perform tasks, check whether any of the "
        "available skills can help complete the task more effectively, and invoke it with the "
        "skill name only (no arguments). When a skill is relevant, invoke it immediately as "
        "your first action, before generating any other response about the task.",
        {"command": _s('The skill name (no arguments), e.g. "pdf" or "xlsx"')},
        ["command"],
    ),
    _claude_tool(
        "AskUserQuestion",
        "Use this tool when you need to ask the user questions during execution. It allows "
        "you to gather user preferences or requirements, clarify ambiguous instructions, get "
        "decisions on implementation choices as you work, and offer choices about what "
        'direction to take. Users will always be able to select "Other" to provide custom '
        "text input. Use multiSelect when several answers can be chosen at once.",
        {
            "questions": {
                "type": "array",
                "minItems": 1,
                "maxItems": 4,
                "description": "Questions to ask the user (1-4 questions)",
                "items": {
                    "type": "object",
                    "properties": {
                        "question": _s("The complete question to ask the user"),
                        "header": _s("Very short label displayed as a chip/tag (max 12 chars)"),
                        "options": {
                            "type": "array",
                            "minItems": 2,
                            "maxItems": 4,
                            "items": {
                                "type": "object",
                                "properties": {
                                    "label": _s("The display text for this option"),
                                    "description": _s("Explanation of what this option means"),
                                },
                                "required": ["label", "description"],
                                "additionalProperties": False,
                            },
                        },
                        "multiSelect": _b("Allow the user to select multiple options"),
                    },
                    "required": ["question", "header", "options", "multiSelect"],
                    "additionalProperties": False,
                },
            }
        },
        ["questions"],
    ),
    _claude_tool(
        "EnterPlanMode",
        "Use this tool to enter plan mode when a task needs a careful design before any code "
        "is written: several files to change, an unclear approach, or a user who asked for a "
        "plan. In plan mode you may only read and search; no edits, no commands with side "
        "effects. Present the plan with ExitPlanMode when it is ready for the user's approval.",
        {"reason": _s("Why this task needs planning first, in one sentence")},
        [],
    ),
    _claude_tool(
        "LS",
        "Lists files and directories in a given path. The path parameter must be an absolute "
        "path, not a relative path. You can optionally provide an array of glob patterns to "
        "ignore with the ignore parameter. You should generally prefer the Glob and Grep "
        "tools if you know which directories to search, since they are faster and their "
        "output is easier to read.",
        {
            "path": _s("The absolute path to the directory to list (must be absolute)"),
            "ignore": {
                "type": "array",
                "items": {"type": "string"},
                "description": "List of glob patterns to ignore",
            },
        },
        ["path"],
    ),
    _claude_tool(
        "ListMcpResourcesTool",
        "Lists available resources from configured MCP servers. Each returned resource "
        "includes all standard MCP resource fields plus a server field indicating which "
        "server the resource belongs to. Give the server parameter to list the resources of "
        "one server only; without it, the resources of every connected server are listed, "
        "which can be slow when many servers are configured.",
        {"server": _s("Optional server name to filter resources by")},
        [],
    ),
    _claude_tool(
        "ReadMcpResourceTool",
        "Reads a specific resource from an MCP server, identified by the server name and the "
        "resource URI. Returns the resource contents as text or as base64-encoded binary with "
        "its MIME type. Use ListMcpResourcesTool first when you do not know which resources "
        "a server exposes; resource URIs are specific to each server and not guessable.",
        {"server": _s("The MCP server name"), "uri": _s("The resource URI to read")},
        ["server", "uri"],
    ),
    _claude_tool(
        "mcp__ide__getDiagnostics",
        "Get language diagnostics from the IDE: errors, warnings and hints that the language "
        "servers of the user's editor report for open files, with their ranges and messages. "
        "Pass a file URI to get the diagnostics of one file; without it, the diagnostics of "
        "every open file are returned. Useful to check a change for type errors before "
        "running the full type checker.",
        {"uri": _s("Optional file URI to get diagnostics for. If not provided, gets all.")},
        [],
    ),
    _claude_tool(
        "mcp__ide__executeCode",
        "Execute python code in the Jupyter kernel for the current notebook file. All code is "
        "executed in the current Jupyter kernel; state persists across calls unless the user "
        "restarts the kernel. Avoid declaring variables or modifying the kernel state unless "
        "the user explicitly asks for it. Any code executed will persist across calls to this "
        "tool, so prefer side-effect-free inspection.",
        {"code": _s("The code to be executed on the kernel.")},
        ["code"],
    ),
]


# --- Codex ---------------------------------------------------------------------------------
#
# A mid-task turn of the Codex CLI, as it POSTs to /v1/responses with `store: false`: no
# `instructions`, the base prompt and the sandbox rules as two developer messages, a user
# message (AGENTS.md, environment, task), then 15 rounds of a reasoning item (encrypted), now
# and then a preamble, an `exec_command` call and its output; 8 function tools and web_search;
# ~50 KB. `codex_chat_turn` is the same conversation as a Chat Completions request, padded to
# the same size.

CODEX_BYTES = 50_000
CODEX_SEED = 50
_CODEX_ROOT = "/home/dev/ledgerly"


@functools.cache
def codex_turn(stream: bool) -> bytes:
    """A Codex turn for POST /v1/responses, ~50 KB, the same bytes every run."""
    return _padded(lambda pad: _encode(_codex_body(pad), stream), CODEX_BYTES, _CODEX_PADDED)


@functools.cache
def codex_chat_turn(stream: bool) -> bytes:
    """The same conversation as a Chat Completions request, as many bytes as the Responses one
    (developer messages joined into the system message, reasoning dropped)."""
    size = len(codex_turn(stream))
    return _padded(lambda pad: _encode(_codex_as_chat(_codex_body(pad)), stream), size, 15)


def _codex_body(pad: int) -> dict[str, Any]:
    rng = random.Random(CODEX_SEED)  # ids and encrypted reasoning: the same for every pad
    cache_key = "-".join(
        "".join(rng.choice("0123456789abcdef") for _ in range(n)) for n in (8, 4, 4, 4, 12)
    )
    items: list[dict[str, Any]] = [
        _codex_message("developer", _CODEX_PROMPT),
        _codex_message("developer", _CODEX_PERMISSIONS),
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": _CODEX_AGENTS_MD},
                {"type": "input_text", "text": _CODEX_ENVIRONMENT},
                {"type": "input_text", "text": _CODEX_TASK},
            ],
        },
    ]
    for step, (preamble, cmd, output) in enumerate(_CODEX_SCRIPT):
        call_id = "call_" + "".join(rng.choice(_BASE62) for _ in range(24))
        items.append(
            {
                "type": "reasoning",
                "id": "rs_" + "".join(rng.choice("0123456789abcdef") for _ in range(48)),
                "summary": [],
                "content": None,
                "encrypted_content": "gAAAAAB"
                + "".join(rng.choice(_BASE64) for _ in range(rng.randrange(700, 1000)))
                + "==",
            }
        )
        if preamble:
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": preamble}],
                }
            )
        items.append(
            {
                "type": "function_call",
                "name": "exec_command",
                "arguments": orjson.dumps({"cmd": cmd}).decode(),
                "call_id": call_id,
            }
        )
        items.append(
            {"type": "function_call_output", "call_id": call_id, "output": _exec(output, pad, step)}
        )
    return {
        "model": MODEL,
        "input": items,
        "tools": _CODEX_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": cache_key,
    }


def _codex_message(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def _exec(output: Output, pad: int, step: int) -> str:
    """What exec_command returns: a header, then the command's output."""
    if isinstance(output, str):
        text = output
    else:
        kind, name, size = output
        text = (_lines if kind == "read" else _test_log)(name, size + pad, step)
    return (
        f"Chunk ID: {step:04x}a1\nWall time: 0.{step + 1} seconds\nProcess exited with code 0\n"
        f"Original token count: {len(text) // 4}\nOutput:\n{text}"
    )


def _lines(path: str, size: int, step: int) -> str:
    """A file as `sed -n` prints it."""
    out, total, n = [], 0, 0
    while total < size:
        line = _CODE[(n + step * 5) % len(_CODE)].format(n=n, step=step, path=path) + "\n"
        out.append(line)
        total += len(line)
        n += 1
    return "".join(out)[:size]


def _codex_as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions request a chat client would send for the same conversation."""
    texts = [
        "\n\n".join(part["text"] for part in item["content"])
        for item in body["input"]
        if item["type"] == "message" and item["role"] != "assistant"
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "\n\n".join(texts[:2])},
        {"role": "user", "content": texts[2]},
    ]
    said: str | None = None
    for item in body["input"]:
        if item["type"] == "message" and item["role"] == "assistant":
            said = item["content"][0]["text"]
        elif item["type"] == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            messages.append({"role": "assistant", "content": said, "tool_calls": [call]})
            said = None
        elif item["type"] == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
    tools = [
        {
            "type": "function",
            "function": {k: t[k] for k in ("name", "description", "parameters")},
        }
        for t in body["tools"]
        if t["type"] == "function"
    ]
    return {
        "model": MODEL,
        "messages": messages,
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning_effort": "medium",
    }


def _codex_tool(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": description,
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
    }


_CODEX_PROMPT_PARTS = [
    (
        "How you work",
        "You are a coding agent running in the Codex CLI, a terminal-based coding assistant. "
        "You are expected to be precise, safe and helpful. You can receive user prompts and "
        "other context provided by the harness, such as files in the workspace; communicate "
        "with the user by streaming thinking and responses, and by making and updating plans; "
        "and emit function calls to run terminal commands and apply patches. Depending on how "
        "this run is configured, you can request that these function calls be escalated to "
        "the user for approval before running.",
    ),
    (
        "Personality",
        "Your default personality and tone is concise, direct and friendly. You communicate "
        "efficiently, always keeping the user clearly informed about ongoing actions without "
        "unnecessary detail. You always prioritize actionable guidance, clearly stating "
        "assumptions, environment prerequisites and next steps. Unless explicitly asked, you "
        "avoid excessively verbose explanations about your work.",
    ),
    (
        "AGENTS.md spec",
        "Repos often contain AGENTS.md files. These files can appear anywhere within the "
        "repository. They are a way for humans to give you instructions or tips for working "
        "within the container: coding conventions, information about how code is organized, "
        "or how to run or test code. The scope of an AGENTS.md file is the entire directory "
        "tree rooted at the folder that contains it. For every file you touch in the final "
        "patch, you must obey instructions in any AGENTS.md file whose scope includes that "
        "file. More-deeply-nested AGENTS.md files take precedence in the case of conflicting "
        "instructions, and direct system, developer or user instructions take precedence over "
        "AGENTS.md instructions.",
    ),
    (
        "Preamble messages",
        "Before making tool calls, send a brief preamble to the user explaining what you are "
        "about to do. Logically group related actions: if you are about to run several related "
        "commands, describe them together in one preamble rather than sending a separate note "
        "for each. Keep it concise: one or two sentences, focused on immediate, tangible next "
        "steps (8-12 words for quick updates). Build on prior context to create a sense of "
        "momentum and clarity for the user, and keep your tone light, friendly and curious. "
        "Exception: avoid adding a preamble for every trivial read such as catting a single "
        "file, unless it is part of a larger grouped action.",
    ),
    (
        "Planning",
        "You have access to an update_plan tool which tracks steps and progress and renders "
        "them to the user. Using the tool helps demonstrate that you have understood the task "
        "and convey how you are approaching it. Plans can make complex, ambiguous or "
        "multi-phase work clearer and more collaborative for the user. A good plan breaks the "
        "task into meaningful, logically ordered steps that are easy to verify as you go. Do "
        "not use plans for simple or single-step queries that you can just do or answer "
        "immediately. Do not pad simple work with filler steps or state the obvious. Before "
        "running a command, consider whether or not you have completed the previous step, and "
        "make sure to mark it as completed before moving on to the next step.",
    ),
    (
        "Task execution",
        "You are a coding agent. Please keep going until the query is completely resolved "
        "before ending your turn and yielding back to the user. Only terminate your turn when "
        "you are sure that the problem is solved. Autonomously resolve the query to the best "
        "of your ability, using the tools available to you, before coming back to the user. "
        "Do NOT guess or make up an answer. Fix the problem at the root cause rather than "
        "applying surface-level patches, when possible. Avoid unneeded complexity in your "
        "solution. Do not attempt to fix unrelated bugs or broken tests. Keep changes "
        "consistent with the style of the existing codebase: changes should be minimal and "
        "focused on the task. Use git log and git blame to search the history of the codebase "
        "if additional context is required. NEVER add copyright or license headers unless "
        "specifically requested. Do not git commit your changes or create new git branches "
        "unless explicitly requested. Do not add inline comments within code unless "
        "explicitly requested.",
    ),
    (
        "Sandbox and approvals",
        "The Codex CLI harness supports several configurations for sandboxing and escalation "
        "approvals that the user can choose from. Filesystem sandboxing defines which files "
        "can be read or written: read-only, workspace-write (you can read files, and write to "
        "files in your workspace folder, but editing files outside it requires approval) or "
        "danger-full-access. Network sandboxing defines whether the network can be accessed "
        "without approval. Approvals are your mechanism to get user consent to perform more "
        "privileged actions; when you need to run a command that requires escalation, ask for "
        "it with the with_escalated_permissions parameter and a one-sentence justification.",
    ),
    (
        "Validating your work",
        "If the codebase has tests or the ability to build or run, consider using them to "
        "verify that your work is complete. When testing, start as specific as possible to "
        "the code you changed so that you can catch issues efficiently, then make your way to "
        "broader tests as you build confidence. If there is no test for the code you changed, "
        "and the patterns in the codebase show that you could add one, you may do so. Once "
        "you are confident in correctness, you can suggest or use formatting commands to make "
        "sure that your code is well formatted. If there are issues you can iterate up to 3 "
        "times to get formatting right, but if you still cannot manage it is better to save "
        "the user time and present them a correct solution.",
    ),
    (
        "Presenting your work and final message",
        "Your final message should read naturally, like an update from a concise teammate. For "
        "casual conversation, brainstorming tasks or quick questions from the user, respond in "
        "a friendly, conversational tone. For substantial changes, lead with a quick "
        "explanation of the change, and then give more details on the context covering where "
        "and why a change was made. Do not start the explanation with an overview; lead with "
        "the change. Reference files with inline code paths such as src/app.ts:42 so they are "
        "clickable. Use headers only when they improve scanability, bullets with a bold "
        "keyword and a short description, and monospace for commands, paths and identifiers.",
    ),
    (
        "Shell commands",
        "When using the shell, you must adhere to the following guidelines. When searching for "
        "text or files, prefer using rg or rg --files respectively because rg is much faster "
        "than alternatives like grep. Read files in chunks with a max chunk size of 250 lines; "
        "do not use python scripts to attempt to output larger chunks of a file. Command line "
        "output will be truncated after 10 kilobytes or 256 lines of output, regardless of the "
        "command used. Always set the workdir parameter when running commands, and avoid cd "
        "unless it is necessary.",
    ),
]
_CODEX_PROMPT = (
    "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI on a "
    "user's computer.\n\n"
    + "\n\n".join(f"## {title}\n\n{text}" for title, text in _CODEX_PROMPT_PARTS * 2)
)
_CODEX_PERMISSIONS = (
    "<permissions instructions>\nFilesystem sandboxing defines which files can be read or "
    "written. `sandbox_mode` is `workspace-write`: the sandbox permits reading files, and "
    "editing files in `cwd` and `writable_roots`. Editing files in other directories requires "
    "approval. Network access is restricted.\nApprovals are your mechanism to get user consent "
    "to run shell commands without the sandbox. `approval_policy` is `on-request`: commands "
    "will be run in the sandbox by default, and you can specify in your tool call if you want "
    "to escalate a command to run without sandboxing. If the completing of the task requires "
    "escalated permissions, do not let the sandbox stop you: request approval.\nWhen you are "
    "running with approval_policy == on-request and sandboxing enabled, here are scenarios "
    "where you will need to request approval: you need to run a command that writes to a "
    "directory that requires it (such as running tests that write to /var), you need to run a "
    "GUI app, you are running sandboxed and need network access (such as installing "
    "packages), or a command that is important to solving the user's query fails because of "
    "sandboxing.\n</permissions instructions>"
)
_CODEX_AGENTS_MD = (
    f"# AGENTS.md instructions for {_CODEX_ROOT}\n\n<INSTRUCTIONS>\n# ledgerly\n\n"
    "Double-entry bookkeeping in Python: accounts, journals, reports.\n\n## Commands\n"
    "- Tests: `uv run pytest -q`\n- Lint: `uv run ruff check . && uv run ruff format --check .`"
    "\n- Types: `uv run mypy src`\n\n## Conventions\n- Money is `Decimal`, never `float`; "
    "amounts carry their currency.\n- Every bug fix comes with a regression test.\n"
    "- Keep `CHANGELOG.md` up to date under `## Unreleased`.\n</INSTRUCTIONS>"
)
_CODEX_ENVIRONMENT = (
    f"<environment_context>\n  <cwd>{_CODEX_ROOT}</cwd>\n  <approval_policy>on-request"
    "</approval_policy>\n  <sandbox_mode>workspace-write</sandbox_mode>\n  <network_access>"
    "restricted</network_access>\n  <shell>bash</shell>\n</environment_context>"
)
_CODEX_TASK = (
    "The monthly balance report double-counts transfers between two accounts in different "
    "currencies. Find the cause, fix it, and add a regression test."
)

# (preamble or "", command, output): fixed text, or ("read" | "log", name, characters)
_CODEX_SCRIPT: list[tuple[str, str, Output]] = [
    (
        "I'll look at the repository layout first.",
        "ls",
        "AGENTS.md\nCHANGELOG.md\nREADME.md\npyproject.toml\nsrc\ntests\nuv.lock\n",
    ),
    (
        "",
        "rg --files src tests",
        "src/ledgerly/__init__.py\nsrc/ledgerly/accounts.py\n"
        "src/ledgerly/currency.py\nsrc/ledgerly/journal.py\nsrc/ledgerly/reports/__init__.py\n"
        "src/ledgerly/reports/balance.py\nsrc/ledgerly/reports/monthly.py\ntests/conftest.py\n"
        "tests/test_accounts.py\ntests/test_journal.py\ntests/test_reports.py\n",
    ),
    (
        "Reading the monthly report and the balance code.",
        "sed -n '1,200p' src/ledgerly/reports/monthly.py",
        ("read", "monthly.py", 900),
    ),
    ("", "sed -n '1,220p' src/ledgerly/reports/balance.py", ("read", "balance.py", 800)),
    (
        "",
        'rg -n "transfer" src',
        "src/ledgerly/journal.py:41:def transfer(\n"
        "src/ledgerly/journal.py:58:    # a transfer books two legs, one per account\n"
        "src/ledgerly/reports/monthly.py:77:        if entry.kind == 'transfer':\n"
        "src/ledgerly/reports/balance.py:103:    transfers = [e for e in entries if e.linked]\n",
    ),
    (
        "Checking how transfers are booked in the journal.",
        "sed -n '1,160p' src/ledgerly/journal.py",
        ("read", "journal.py", 700),
    ),
    ("", "sed -n '1,120p' src/ledgerly/currency.py", ("read", "currency.py", 500)),
    (
        "Running the report tests to see the current state.",
        "uv run pytest -q tests/test_reports.py",
        ("log", "test_reports.py", 700),
    ),
    ("", "sed -n '1,200p' tests/test_reports.py", ("read", "test_reports.py", 600)),
    (
        "",
        "git log --oneline -8 -- src/ledgerly/reports",
        "9f1c2ab Monthly report: group by "
        "currency\n41d7e90 Balance: link the legs of a transfer\n0be3a11 Reports: one module per "
        "report\nc7d2f45 Journal: transfers across currencies\n",
    ),
    (
        "",
        "git show 41d7e90 --stat",
        "commit 41d7e90\nAuthor: dev <dev@example.com>\n\n"
        "    Balance: link the legs of a transfer\n\n src/ledgerly/reports/balance.py | 18 "
        "+++++++++++-----\n tests/test_reports.py           | 24 ++++++++++++++++++++++++\n"
        " 2 files changed, 37 insertions(+), 5 deletions(-)\n",
    ),
    (
        "Found it: both legs are summed once converted. Patching balance.py.",
        "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: src/ledgerly/reports/balance.py\n"
        "@@ def monthly_totals(entries, currency):\n-    for entry in entries:\n+    for entry in "
        "_one_leg_per_transfer(entries):\n*** End Patch\nEOF",
        "Success. Updated the following files:\nM src/ledgerly/reports/balance.py\n",
    ),
    ("", "uv run pytest -q tests/test_reports.py", ("log", "test_reports.py", 600)),
    (
        "Adding a regression test for cross-currency transfers.",
        "sed -n '200,320p' tests/test_reports.py",
        ("read", "test_reports.py", 500),
    ),
    ("", "uv run pytest -q", ("log", "all", 700)),
]
_CODEX_PADDED = sum(not isinstance(output, str) for *_, output in _CODEX_SCRIPT)


def _str(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


_CODEX_TOOLS: list[dict[str, Any]] = [
    _codex_tool(
        "exec_command",
        "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
        {
            "cmd": _str("Shell command to execute."),
            "workdir": _str("Optional working directory; defaults to the turn's cwd."),
            "shell": _str("Shell binary to launch. Defaults to /bin/bash."),
            "login": {"type": "boolean", "description": "Whether to run with -l/-i semantics."},
            "yield_time_ms": {
                "type": "number",
                "description": "How long to wait (in milliseconds) for output before yielding.",
            },
            "max_output_tokens": {
                "type": "number",
                "description": "Maximum number of tokens to return; excess output is truncated.",
            },
            "with_escalated_permissions": {
                "type": "boolean",
                "description": "Whether to request escalated permissions (outside the sandbox).",
            },
            "justification": _str(
                "Only set if with_escalated_permissions is true: a one-sentence explanation "
                "of why the command needs them."
            ),
        },
        ["cmd"],
    ),
    _codex_tool(
        "write_stdin",
        "Writes characters to an existing unified exec session and returns recent output.",
        {
            "session_id": {"type": "number", "description": "Identifier of the running session."},
            "chars": _str("Bytes to write to stdin (may be empty to poll)."),
            "yield_time_ms": {"type": "number", "description": "How long to wait for output."},
            "max_output_tokens": {"type": "number", "description": "Maximum tokens to return."},
        },
        ["session_id"],
    ),
    _codex_tool(
        "update_plan",
        "Updates the task plan. Provide an optional explanation and a list of plan items, each "
        "with a step and status. At most one step can be in_progress at a time.",
        {
            "explanation": _str("Why the plan changed."),
            "plan": {
                "type": "array",
                "description": "The list of steps",
                "items": {
                    "type": "object",
                    "properties": {
                        "step": {"type": "string"},
                        "status": {
                            "type": "string",
                            "description": "One of: pending, in_progress, completed",
                        },
                    },
                    "required": ["step", "status"],
                    "additionalProperties": False,
                },
            },
        },
        ["plan"],
    ),
    _codex_tool(
        "apply_patch",
        "Use the apply_patch tool to edit files. The patch language is a stripped-down, "
        "file-oriented diff format: *** Begin Patch, then one or more file operations (*** Add "
        "File, *** Delete File, *** Update File with @@ hunks of context, - and + lines), then "
        "*** End Patch. File references must be relative, never absolute.",
        {"input": _str("The entire contents of the apply_patch command")},
        ["input"],
    ),
    _codex_tool(
        "view_image",
        "Attach a local image (by filesystem path) to the conversation context for this turn.",
        {"path": _str("Local filesystem path to an image file")},
        ["path"],
    ),
    _codex_tool(
        "list_mcp_resources",
        "Lists resources provided by MCP servers. Resources give the model access to files, "
        "database schemas or application-specific information. Prefer resources over web "
        "search when possible.",
        {
            "server": _str("Optional MCP server name; when omitted, lists every server's."),
            "cursor": _str("Opaque cursor returned by a previous call for the same server."),
        },
        [],
    ),
    _codex_tool(
        "list_mcp_resource_templates",
        "Lists resource templates provided by MCP servers (parameterized resources).",
        {
            "server": _str("Optional MCP server name; when omitted, lists every server's."),
            "cursor": _str("Opaque cursor returned by a previous call for the same server."),
        },
        [],
    ),
    _codex_tool(
        "read_mcp_resource",
        "Read a specific resource from an MCP server given the server name and resource URI.",
        {
            "server": _str("MCP server name exactly as configured."),
            "uri": _str("Resource URI to read; must be one of the URIs list_mcp_resources gave."),
        },
        ["server", "uri"],
    ),
    {"type": "web_search"},
]


def _main() -> None:
    """Prints every body's size."""
    bodies: dict[str, Callable[[bool], bytes]] = {
        "tiny": tiny,
        "agent_turn": agent_turn,
        "claude_code_turn": claude_code_turn,
        "claude_code_chat_turn": claude_code_chat_turn,
        "codex_turn": codex_turn,
        "codex_chat_turn": codex_chat_turn,
        "gemini_turn": gemini_turn,
    }
    for name, build in bodies.items():
        for stream in (False, True):
            print(f"{name:<22} stream={stream!s:<5} {len(build(stream)):>7,} bytes")


if __name__ == "__main__":
    _main()
