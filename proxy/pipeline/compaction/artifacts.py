"""The ledger of what the agent touched: the files its tool calls read, wrote, edited or
deleted (the last action each) and the commands it ran, merged into every summary's ARTIFACTS
section so that a summarizer that forgets a file cannot make the agent forget it.

Deterministic from the history alone: a compaction extends the ledger of the checkpoint it
builds on (stored with it) by the tool calls of the stretch it summarizes, so every replica,
and the same process after a restart, writes the same bytes; and the summary, once made, is
reused byte for byte with the checkpoint. Walked only at a compaction event, over the stretch
being summarized, never on a common turn.

Recognised, on the chat-shaped view every wire gives the stages (tool call names and
arguments): Claude Code's Read / Write / Edit / MultiEdit / NotebookEdit / Bash, Codex's
apply_patch (the paths inside the patch) and shell / shell_command / exec_command (a command
as a list or a string, an apply_patch inside it parsed too), a text editor tool's
`command` + `path`, and any tool with a `file_path`, `path`, `filename` or `notebook_path`
argument (its action guessed from its name, a read when it says nothing). A shell command's
obvious writes (`> file`, `>> file`, `rm file`) count too; anything less plain is only a
command. A read after a change keeps the change: the summary must say the file was changed.

Bounded: MAX_FILES files and the last MAX_COMMANDS commands (each cut to COMMAND_CHARS) are
kept, the rest counted; what is added to a summary is held to the characters it is given,
with "and N more" for the rest.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.messages import Message, call_body
from proxy.pipeline.compaction.sections import section_span

READ, WRITTEN, EDITED, DELETED = "read", "written", "edited", "deleted"
MAX_FILES = 256
MAX_COMMANDS = 20
COMMAND_CHARS = 200
MAX_PATH_CHARS = 512
SCRIPT_CHARS = 8_000  # of a shell script, looked at for its writes
SCRIPT_LINES = 50

PATH_ARGUMENTS = ("file_path", "path", "filename", "notebook_path")
NAMED_TOOLS = {  # Claude Code's, by name (lower case)
    "read": READ,
    "notebookread": READ,
    "write": WRITTEN,
    "edit": EDITED,
    "multiedit": EDITED,
    "notebookedit": EDITED,
}
COMMAND_TOOLS = ("bash", "shell", "shell_command", "exec_command", "local_shell", "container.exec")
EDITOR_COMMANDS = {  # a text editor tool's `command` (Anthropic's str_replace_based_edit_tool)
    "view": READ,
    "create": WRITTEN,
    "str_replace": EDITED,
    "insert": EDITED,
    "undo_edit": EDITED,
}
# What a tool's name says it does to the file it names; a read when it says nothing.
_NAME_ACTIONS = (
    (re.compile(r"delete|remove|unlink|(?:^|_)rm(?:$|_)"), DELETED),
    (re.compile(r"write|create|save|put"), WRITTEN),
    (re.compile(r"edit|replace|patch|insert|update|modify|append|move|rename"), EDITED),
)
_PATCH_LINE = re.compile(
    r"^\*\*\* (?:(Add|Update|Delete) File|(Move) to): *(\S[^\r\n]*?)[ \t]*\r?$", re.MULTILINE
)
_PATCH_ACTIONS = {"Add": WRITTEN, "Update": EDITED, "Delete": DELETED}
_SHELLS = ("bash", "sh", "zsh", "/bin/bash", "/bin/sh", "/bin/zsh", "/usr/bin/bash")
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", ";;", "|&"}
_MORE = "- … and 999999 more files"  # room kept for the line saying what did not fit
_REDIRECTS = {">": WRITTEN, ">|": WRITTEN, ">>": EDITED, "&>": WRITTEN, "&>>": EDITED}


@dataclass(frozen=True, slots=True)
class ArtifactLedger:
    files: tuple[tuple[str, str], ...] = ()  # (path, last action), least recently touched first
    commands: tuple[str, ...] = ()  # the last MAX_COMMANDS, oldest first
    more_files: int = 0  # files left out past MAX_FILES
    more_commands: int = 0  # commands run before those kept

    def __bool__(self) -> bool:
        return bool(self.files or self.commands)

    @property
    def size(self) -> int:
        """Roughly its bytes, for the caches that hold it with a checkpoint."""
        return (
            64 * (len(self.files) + len(self.commands))
            + sum(len(p) for p, _ in self.files)
            + sum(map(len, self.commands))
        )

    def chars(self) -> int:
        """About the characters all of its lines would take in a summary."""
        files = sum(len(p) + len(a) + 6 for p, a in self.files)
        return 120 + files + sum(len(c) + 5 for c in self.commands)

    def extended(self, messages: Iterable[Message]) -> ArtifactLedger:
        """This ledger followed by the tool calls of `messages`, in order."""
        files = dict(self.files)
        commands = list(self.commands)
        more_commands = self.more_commands
        for name, arguments in _tool_calls(messages):
            paths, command = touches(name, arguments)
            for path, action in paths:
                earlier = files.pop(path, None)
                if action == READ and earlier is not None and earlier != READ:
                    action = earlier  # a read after a change: the change is what matters
                files[path] = action
            if command is not None:
                commands.append(command)
        if len(commands) > MAX_COMMANDS:
            more_commands += len(commands) - MAX_COMMANDS
            commands = commands[-MAX_COMMANDS:]
        kept, dropped = _capped(files)
        return ArtifactLedger(kept, tuple(commands), self.more_files + dropped, more_commands)

    def to_json(self) -> dict[str, Any]:
        return {
            "files": [list(f) for f in self.files],
            "commands": list(self.commands),
            "more_files": self.more_files,
            "more_commands": self.more_commands,
        }

    @classmethod
    def from_json(cls, raw: Any) -> ArtifactLedger:
        """As to_json wrote it; anything else (an older checkpoint: none) is an empty one."""
        if not isinstance(raw, dict):
            return cls()
        files = tuple(
            (str(f[0]), str(f[1]))
            for f in raw.get("files") or ()
            if isinstance(f, list) and len(f) == 2
        )[-MAX_FILES:]
        commands = tuple(str(c) for c in raw.get("commands") or ())[-MAX_COMMANDS:]
        return cls(
            files, commands, int(raw.get("more_files") or 0), int(raw.get("more_commands") or 0)
        )

    def merged_into(self, summary: str, chars: int) -> str:
        """`summary` with what the ledger knows and its ARTIFACTS section does not name added
        at the end of that section (files by path, then commands in order), in at most
        `chars` characters; a summary cut before its ARTIFACTS gets one at its end."""
        span = section_span(summary, "ARTIFACTS")
        section = summary[span[0] : span[1]] if span else ""
        lines = self._lines(section, chars)
        if not lines:
            return summary
        block = "\n".join(lines)
        if span is None:
            return f"{summary.rstrip()}\n\nARTIFACTS:\n{block}"
        start, end = span
        before, after = summary[:start] + section.rstrip(), summary[end:]
        return f"{before}\n{block}\n\n{after}" if after else f"{before}\n{block}"

    def _lines(self, named: str, chars: int) -> list[str]:
        """The lines to add, within `chars`: the changed files first, then the read ones, the
        most recent first, shown by path; then the latest commands, shown in order."""
        files = [(p, a) for p, a in self.files if p not in named]
        commands = [c for c in self.commands if c not in named]
        lines: list[str] = []
        left = chars
        ranked = [f for f in reversed(files) if f[1] != READ] + [
            f for f in reversed(files) if f[1] == READ
        ]
        header = "Files the agent's tool calls touched (last action):"
        shown: list[tuple[str, str]] = []
        if ranked:
            left -= len(header) + len(_MORE) + 2
            for path, action in ranked:
                line = f"- {path} ({action})"
                if len(line) + 1 > left:
                    break
                shown.append((path, action))
                left -= len(line) + 1
        more = len(ranked) - len(shown) + (self.more_files if files else 0)
        if shown:
            lines += [header, *(f"- {p} ({a})" for p, a in sorted(shown))]
            if more:
                lines.append(f"- … and {more} more files")
        kept: list[str] = []
        title = "Commands the agent ran (the latest last):"
        if commands:
            left -= len(title) + len(_MORE) + 2
            for command in reversed(commands):
                line = f"- `{command}`"
                if len(line) + 1 > left:
                    break
                kept.append(command)
                left -= len(line) + 1
        if kept:
            earlier = len(commands) - len(kept) + self.more_commands
            lines.append(title)
            if earlier:
                lines.append(f"- … and {earlier} earlier commands")
            lines += [f"- `{c}`" for c in reversed(kept)]
        return lines


EMPTY = ArtifactLedger()


def touches(name: str, arguments: Any) -> tuple[list[tuple[str, str]], str | None]:
    """The files one tool call touches, with what it did to each, and the command it ran
    (None: it ran none). `arguments`: as the call carries them (JSON text, or a custom
    tool's free-form input)."""
    tool = name.strip().lower()
    args = _parsed(arguments)
    if tool == "apply_patch" or tool.endswith(".apply_patch"):
        patch = args if isinstance(args, str) else args.get("input") or args.get("patch")
        return (patch_touches(patch) if isinstance(patch, str) else []), None
    if not isinstance(args, dict):
        return [], None
    if tool in COMMAND_TOOLS:
        return _command_touches(args.get("command", args.get("cmd")))
    path = ""
    for key in PATH_ARGUMENTS:
        value = args.get(key)
        if isinstance(value, str):
            path = _clean(value)
            break
    if not path:
        return [], None
    action = NAMED_TOOLS.get(tool)
    if action is None:
        command = args.get("command")
        action = EDITOR_COMMANDS.get(command) if isinstance(command, str) else None
    return [(path, action or _action_named(tool))], None


@functools.lru_cache(maxsize=1024)
def _action_named(tool: str) -> str:
    """What a tool's name says it does to the file it names (a few names in a session)."""
    return next((action for pattern, action in _NAME_ACTIONS if pattern.search(tool)), READ)


def patch_touches(patch: str) -> list[tuple[str, str]]:
    """The files an apply_patch patch adds, updates, deletes or moves (`*** Move to:` after
    an update: the old path is gone, the new one holds the edit)."""
    found: list[tuple[str, str]] = []
    for match in _PATCH_LINE.finditer(patch):
        kind, move, raw = match.groups()
        path = _clean(raw)
        if not path:
            continue
        if move and found and found[-1][1] == EDITED:
            found[-1] = (found[-1][0], DELETED)
            found.append((path, EDITED))
        elif kind:
            found.append((path, _PATCH_ACTIONS[kind]))
    return found


def shell_writes(script: str) -> list[tuple[str, str]]:
    """The plain file writes of a shell script: a `>`/`>>` redirection's target, `rm`'s
    operands. Nothing with a variable, a glob or a substitution; a heredoc's body and what
    follows it are not read."""
    found: list[tuple[str, str]] = []
    if ">" not in script and "rm" not in script:
        return found  # most commands: nothing to look for
    for line in script[:SCRIPT_CHARS].splitlines()[:SCRIPT_LINES]:
        if ">" in line or "rm" in line:
            found += _line_writes(line)
        if "<<" in line:
            break
    return found


def _line_writes(line: str) -> list[tuple[str, str]]:
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: not plain
        return []
    found: list[tuple[str, str]] = []
    starts, removing = True, False
    for i, token in enumerate(tokens):
        if token in _SEPARATORS:
            starts, removing = True, False
            continue
        action = _REDIRECTS.get(token)
        if action is not None:
            target = tokens[i + 1] if i + 1 < len(tokens) else ""
            if _plain(target):
                found.append((_clean(target), action))
            removing = False
        elif removing and not token.startswith("-") and _plain(token):
            found.append((_clean(token), DELETED))
        elif starts:
            removing = token == "rm"
        starts = False
    return [(p, a) for p, a in found if p]


def _command_touches(command: Any) -> tuple[list[tuple[str, str]], str | None]:
    script = _script(command)
    if not script:
        return [], None
    if "*** Begin Patch" in script:  # apply_patch through the shell, as Codex may call it
        return patch_touches(script), None
    line = " ".join(script.split())
    if len(line) > COMMAND_CHARS:
        line = line[: COMMAND_CHARS - 1] + "…"
    return shell_writes(script), line


def _script(command: Any) -> str:
    """A command as the shell runs it: a string as is; an argv's `bash -lc SCRIPT` as
    SCRIPT, any other argv joined as a shell would quote it."""
    if isinstance(command, str):
        return command.strip()
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        return ""
    argv: list[str] = command
    if len(argv) == 3 and argv[0] in _SHELLS and argv[1] in ("-c", "-lc", "-ic"):
        return argv[2].strip()
    return shlex.join(argv)


def _tool_calls(messages: Iterable[Message]) -> Iterator[tuple[str, Any]]:
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            body, key = call_body(call)
            if body is not None and isinstance(body.get("name"), str):
                yield body["name"], body.get(key)


def _parsed(arguments: Any) -> dict[str, Any] | str:
    """A call's arguments as an object when they are JSON of one; a free-form input as text."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        return {}
    if arguments.lstrip().startswith("{"):
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
        return value if isinstance(value, dict) else {}
    return arguments


def _clean(path: str) -> str:
    """A path as the ledger keeps it ("" when it is not one: empty, too long, multi-line)."""
    path = path.strip()
    if path.startswith("./"):
        path = path[2:]
    if not path or len(path) > MAX_PATH_CHARS or "\n" in path or "\r" in path:
        return ""
    return path


def _plain(token: str) -> bool:
    """A literal file name: no variable, glob, substitution, descriptor or device."""
    return (
        bool(token)
        and not any(c in token for c in "$`*?[{~<>&|;")
        and not token.startswith("/dev/")
        and not token.isdigit()
    )


def _capped(files: dict[str, str]) -> tuple[tuple[tuple[str, str], ...], int]:
    """At most MAX_FILES, the least recently read ones left out first, then the least
    recently changed; and how many were left out."""
    excess = len(files) - MAX_FILES
    if excess <= 0:
        return tuple(files.items()), 0
    out: set[str] = set()
    for path, action in files.items():
        if len(out) == excess:
            break
        if action == READ:
            out.add(path)
    for path in files:
        if len(out) == excess:
            break
        out.add(path)
    return tuple((p, a) for p, a in files.items() if p not in out), excess
