"""Reusable scripted Responders for the Simulator: small "models" that play a known scenario
with a real agent (Claude Code, Codex, ...) on the other end.

A Responder gets the request as an OpenAI-shaped chat body (the Anthropic twin converts it) and
returns an assistant message; the Simulator renders it in the wire format the client spoke.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from proxy.sim.model import JSON, is_summary_request, text_of

# Claude Code's shell tool, as its requests declare it: {"command": str, "description": str,
# "timeout": number, "run_in_background": bool, ...}; only "command" is required.
CLAUDE_CODE_SHELL_TOOL = "Bash"
# Codex's shell tool (0.171), a Responses function tool: {"cmd": str, "workdir": str,
# "yield_time_ms": number, "max_output_tokens": number, "login": bool, "tty": bool, "shell": str,
# "sandbox_permissions": "use_default" | "require_escalated", ...}; only "cmd" is required.
CODEX_SHELL_TOOL = "exec_command"


def _offered_tools(chat: JSON) -> set[str]:
    names = set()
    for tool in chat.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return names


@dataclass
class ToolRoundTrip:
    """Call `tool` with `arguments` once, then answer with text quoting what it returned.

    Stateless: each request is judged from its own history, so the same scenario replays the
    same way however often the agent retries. A request that does not offer the tool (an
    agent's side query: a title, a summary) gets a plain `idle_answer`."""

    tool: str = CLAUDE_CODE_SHELL_TOOL
    arguments: JSON = field(
        default_factory=lambda: {"command": "ls", "description": "List files in current directory"}
    )
    answer_prefix: str = "The command listed:\n"
    idle_answer: str = "OK."

    def __call__(self, chat: JSON) -> JSON:
        if self.tool not in _offered_tools(chat):
            return {"role": "assistant", "content": self.idle_answer}
        results = self.results(chat)
        if results:
            return {"role": "assistant", "content": self.final_text(results[-1])}
        call = {
            "type": "function",
            "function": {"name": self.tool, "arguments": orjson.dumps(self.arguments).decode()},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    def results(self, chat: JSON) -> list[str]:
        """The texts of the tool results answering calls of `tool`, oldest first."""
        messages = chat.get("messages") or []
        call_ids = {
            call.get("id")
            for message in messages
            if message.get("role") == "assistant"
            for call in message.get("tool_calls") or []
            if isinstance(call, dict) and (call.get("function") or {}).get("name") == self.tool
        }
        return [
            text_of(message.get("content"))
            for message in messages
            if message.get("role") == "tool" and message.get("tool_call_id") in call_ids
        ]

    def final_text(self, result: str) -> str:
        return self.answer_prefix + result.strip()


@dataclass
class ToolRounds(ToolRoundTrip):
    """Call `tool` once per entry of `commands` (one per turn, in order), then answer with
    text quoting the last result: a long agent task in a few lines, for compaction and offload
    to act on. The step rides in the command as a shell comment ("# step N"), which stays in
    the recent part of a compacted history, so a proxy's rewrites do not restart the task.
    `key` names the command argument (Claude Code's Bash: "command"; Codex's exec_command:
    "cmd")."""

    commands: list[str] = field(default_factory=lambda: ["ls"])
    key: str = "command"

    def __call__(self, chat: JSON) -> JSON:
        if self.tool not in _offered_tools(chat):
            return {"role": "assistant", "content": self.idle_answer}
        done = self.steps_done(chat)
        if done >= len(self.commands):
            results = self.results(chat)
            return {"role": "assistant", "content": self.final_text(results[-1][-200:])}
        arguments = {self.key: f"{self.commands[done]}  # step {done + 1}"}
        call = {
            "type": "function",
            "function": {"name": self.tool, "arguments": orjson.dumps(arguments).decode()},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    def steps_done(self, chat: JSON) -> int:
        """The highest step whose call has its result in the history."""
        if not self.results(chat):
            return 0
        steps = [0]
        for message in chat.get("messages") or []:
            if message.get("role") != "assistant":
                continue
            for call in message.get("tool_calls") or []:
                arguments = (call.get("function") or {}).get("arguments") or "{}"
                try:
                    command = str(orjson.loads(arguments).get(self.key, ""))
                except (orjson.JSONDecodeError, AttributeError):
                    continue
                _, mark, step = command.rpartition("# step ")
                if mark and step.isdigit():
                    steps.append(int(step))
        return max(steps)


# What SmolLM2-135M answered, asked for a four-section summary of a coding session (issue 15):
# no sections, no goal, and a task declared done that was not.
FORGETFUL_SUMMARY = (
    "In summary, the user's goal was achieved. The task was completed successfully and no "
    "further steps are needed."
)


@dataclass
class ForgetfulSummarizer:
    """A small model as the proxy's summarizer meets it: every summary request gets
    `answer` (no sections, no goal); every other request goes to `agent`, the model's
    behaviour in the session itself. Counts the summary requests it answered."""

    agent: Callable[[JSON], JSON]
    answer: str = FORGETFUL_SUMMARY
    summaries: int = 0

    def __call__(self, chat: JSON) -> JSON:
        if is_summary_request(chat.get("messages") or []):
            self.summaries += 1
            return {"role": "assistant", "content": self.answer}
        return self.agent(chat)


def codex_shell_round_trip(command: str = "ls") -> ToolRoundTrip:
    """ToolRoundTrip for Codex: call its `exec_command` with `{"cmd": command}` once, then
    answer with text quoting the output Codex sent back."""
    return ToolRoundTrip(tool=CODEX_SHELL_TOOL, arguments={"cmd": command})
