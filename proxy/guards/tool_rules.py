"""Tool-call rules (`guard.tool_calls`): the one place that decides which of the model's tool
calls may reach the client. The wires ask it two things: whether a streamed call of a tool
must be held until its arguments are complete (`watcher`: only when a rule could match the
tool; any other stream flows unbuffered), and, the answer's calls complete, what to do with
them (`judge`). Each wire then takes the denied calls out of its answer and adds the refusal
text (its Replies' `refused`, its relay's `release`).

A denied call is taken out and the others are kept: a stream cannot take back a call it
already passed unheld, and the client stores the assistant message as it got it, so its next
turn answers exactly the calls it saw (valid for every provider). With no call left, the
answer ends as a plain answer (not tool_calls / tool_use), so the agent's loop goes on and the
model reads the refusal in its own last message.

A rule judges the arguments as the client would get them: with the session's placeholders
given back (guards/secrets/restore.py), since that is what the agent would run. A rule written
against a secret (`arguments: 'AKIA[0-9A-Z]{16}'`) holds whether or not the guard scrubbed it
on the way up, and a rule never has to know the placeholders' form. The verdict is reached
before the answer is given back (the flow judges the upstream's calls; the wire then takes the
denied out and gives back the rest), and neither the refusal nor the events carry arguments."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.exchange import Exchange
from proxy.guards.mode import STAGE, dry_run, reported
from proxy.guards.secrets.restore import restore_in_json, restore_text
from proxy.metrics import Metrics
from proxy.policies.spec import Policy, ToolCallRule

REFUSED = (
    "[agentproxy guard] The tool call `{tool}` was refused by this proxy's policy and was not "
    "run: {reason}. Do not try it again; continue another way or ask the user."
)
NO_REASON = "it matches a rule the operator set (rule {rule})"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with an answer's tool calls: the positions (in the answer's order of calls)
    of those denied, and the text the client reads in their place."""

    denied: frozenset[int]
    text: str


Recording = Callable[..., None]  # Recorder.record(ex, stage, action, **fields)


def watcher(policy: Policy) -> Callable[[str], bool] | None:
    """Whether a streamed call of a tool must be held until complete; None: no rules."""
    rules = policy.guard.tool_calls
    if not rules:
        return None
    return lambda tool: any(rule.watches(tool) for rule in rules)


def judge(
    ex: Exchange, calls: Sequence[dict[str, Any]], record: Recording, metrics: Metrics
) -> Verdict | None:
    """The rules over the answer's (chat-shaped) calls: every match recorded and counted; the
    calls to take out, or None when nothing changes (no rules, none denied, a dry run)."""
    rules = ex.policy.guard.tool_calls
    if not rules or not calls:
        return None
    denied: list[int] = []
    refusals: list[str] = []
    for position, call in enumerate(calls):
        tool, arguments = _tool(call), _arguments(call, ex.secrets)
        rule = next((r for r in rules if _matches(r, tool, arguments)), None)
        if rule is None:
            continue
        action = reported(ex, rule.action)
        metrics.child(metrics.guard, action, rule.label).inc()
        reason = rule.reason or NO_REASON.format(rule=rule.label)
        record(ex, STAGE, action, tool=tool[:200], rule=rule.label, reason=reason)
        if rule.action == "deny" and not dry_run(ex):
            denied.append(position)
            refusals.append(REFUSED.format(tool=tool[:200], reason=reason))
    if not denied:
        return None
    return Verdict(frozenset(denied), "\n".join(refusals))


def _matches(rule: ToolCallRule, tool: str, arguments: str) -> bool:
    if not rule.watches(tool):
        return False
    return rule.arguments is None or rule.arguments.search(arguments) is not None


def _tool(call: dict[str, Any]) -> str:
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else ""


def _arguments(call: dict[str, Any], secrets: Mapping[str, str] | None) -> str:
    """The arguments as the client would get them: the model's text, or (an object:
    Anthropic's and Gemini's whole answers) its JSON, with the session's placeholders given
    back as the answer will give them back (in an object's JSON, escaped)."""
    function = call.get("function")
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if isinstance(arguments, str):
        return arguments if not secrets else restore_text(arguments, secrets)
    if arguments is None:
        return ""
    try:
        text = orjson.dumps(arguments)
    except TypeError:
        return str(arguments)
    return (text if not secrets else restore_in_json(text, secrets)).decode()
