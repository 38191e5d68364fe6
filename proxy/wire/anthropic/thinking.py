"""Signed thinking blocks a client dropped, put back from what the proxy relayed.

With thinking on, Anthropic refuses a tool loop whose assistant turn does not start with the
thinking block the model answered with ("Expected `thinking` or `redacted_thinking`, but found
`tool_use`"), and the block's signature must come back byte for byte. Some clients drop it:
Claude Code 2.1.197 strips the thinking of every answer whose `model` is not the one it asked
for, and a proxy answers for its alias with the provider's model id. The proxy relayed those
blocks, so it remembers them (those of the last answers that called tools, in the session's
TurnMemory under the owner's key) and puts them back in front of the assistant message that
came back with the same tool_use ids: the request is then what the provider sent. When nothing
can be put back and the loop would be refused, thinking is turned off for that request only
(with the context-management edits that need it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from proxy.sessions.turn_memory import TurnMemory
from proxy.wire.anthropic.memory import Relayed, RelayedThinking

Block = dict[str, Any]
Message = dict[str, Any]
THINKING = ("thinking", "redacted_thinking")
ANSWERS_PER_SESSION = 16  # a client sends an answer back on the next turn: a few suffice
CLEAR_THINKING = "clear_thinking_20251015"  # a context-management edit that needs thinking on


def relayed(content: Iterable[Any]) -> tuple[str, Relayed] | None:
    """An answer's content as what to remember, by its first tool_use id: None when it
    called no tool or carried no thinking (nothing a tool loop would need back)."""
    blocks: list[Block] = []
    calls: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind in THINKING:
            blocks.append(block)
        elif kind == "tool_use" and isinstance(block.get("id"), str):
            calls.append(block["id"])
    if not blocks or not calls:
        return None
    return calls[0], Relayed(frozenset(calls), tuple(blocks))


def remembered(memory: TurnMemory, owner: str, session: str) -> Mapping[str, Relayed]:
    """The thinking of the last answers relayed to the owner's session that called tools, by
    their first tool_use id."""
    kept = memory.relayed(owner, session, RelayedThinking)
    return kept.answers if kept is not None else {}


def remember(memory: TurnMemory, owner: str, session: str, content: Iterable[Any]) -> None:
    """An answer relayed to the owner's session, remembered if it called tools with thinking
    (beside the last ANSWERS_PER_SESSION - 1)."""
    found = relayed(content)
    if found is None:
        return
    first, answer = found
    answers = dict(list(remembered(memory, owner, session).items())[-(ANSWERS_PER_SESSION - 1) :])
    answers[first] = answer
    thinking = RelayedThinking(answers)
    memory.keep_relayed(owner, session, thinking, thinking.size)


def thinking_on(body: Mapping[str, Any]) -> bool:
    """Whether the request turns thinking on ("enabled" or "adaptive")."""
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def _content(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


def _first_type(content: list[Any]) -> Any:
    return content[0].get("type") if content and isinstance(content[0], dict) else None


def _call_ids(content: list[Any]) -> list[str]:
    return [
        b["id"]
        for b in content
        if isinstance(b, dict) and b.get("type") == "tool_use" and isinstance(b.get("id"), str)
    ]


def dropped(
    messages: list[Any], start: int, answers: Mapping[str, Relayed]
) -> dict[int, tuple[Block, ...]]:
    """From `start` on, the assistant messages that came back without the thinking their
    answer had (the same tool_use ids, no thinking block): index -> the blocks to put back."""
    found: dict[int, tuple[Block, ...]] = {}
    if not answers:
        return found
    for index in range(start, len(messages)):
        message = messages[index]
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        content = _content(message)
        calls = _call_ids(content)
        answer = answers.get(calls[0]) if calls else None
        if answer is None or answer.calls != frozenset(calls):
            continue
        if any(isinstance(b, dict) and b.get("type") in THINKING for b in content):
            continue  # it kept (some of) its thinking: the client's as sent
        found[index] = answer.blocks
    return found


def loop_start(messages: list[Any], floor: int = 0, before: int | None = None) -> int | None:
    """The first assistant message of the tool loop the request continues (it ends with tool
    results): a tool loop is one assistant turn, and that turn must start with thinking. None
    when the request does not continue one.

    Incremental: `messages[:floor]` is a history already looked at, whose loop started at
    `before` (None: it ended in none); only the messages from `floor` on are walked."""
    turns = [
        i
        for i in range(floor, len(messages))
        if isinstance(messages[i], dict) and messages[i].get("role") != "system"
    ]
    if not turns:
        return before
    start: int | None = None
    at = len(turns) - 1
    while at >= 1:
        answer, asked = messages[turns[at]], messages[turns[at - 1]]
        results = any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in _content(answer)
        )
        if answer.get("role") != "user" or asked.get("role") != "assistant" or not results:
            break
        if not _call_ids(_content(asked)):
            break
        start = turns[at - 1]
        at -= 2
    if at == -1 and floor:  # every new message in the loop: it goes on from the history's
        return before if before is not None else start
    if at == 0 and floor:  # a pair across the boundary: walk it all
        return loop_start(messages)
    return start


def starts_with_thinking(message: Any, restored: tuple[Block, ...] | None) -> bool:
    return bool(restored) or _first_type(_content(message)) in THINKING


def without_thinking(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with thinking off for this request: no `thinking`, and no context-management
    edit that needs it (the API refuses clear_thinking without thinking on)."""
    out = {name: value for name, value in body.items() if name != "thinking"}
    management = out.get("context_management")
    if isinstance(management, dict) and isinstance(management.get("edits"), list):
        edits = [
            e
            for e in management["edits"]
            if not (isinstance(e, dict) and e.get("type") == CLEAR_THINKING)
        ]
        if len(edits) != len(management["edits"]):
            if edits or set(management) != {"edits"}:
                out["context_management"] = {**management, "edits": edits}
            else:
                del out["context_management"]
    return out
