"""What replay measures on a body: its tokens, and how much of it a prefix cache would hold.

Tokens are the simulator's count (four characters a token over contents, tool calls and tool
schemas), entry by entry (proxy/sim/measure.py: the one measure, which the session list shows
too), the same for what the client sent and what went upstream, so the two compare. The
cache is a prefix model: the part of a prompt (tools, then its messages in order) equal to the
previous prompt sent upstream is read from the cache, the rest is written to it.
"""

from __future__ import annotations

from typing import Any

from proxy.sim.measure import body_tokens, wire_at
from proxy.sim.model import estimate_prompt_tokens, is_summary_request
from proxy.sim.simulator import as_chat as as_chat  # what the engine reads bodies as

JSON = dict[str, Any]


def prompt_tokens(path: str, body: JSON) -> int:
    return body_tokens(wire_at(path), body)


def is_summary(path: str, body: JSON) -> bool:
    """A call of the proxy's summarizer rather than the client's own turn."""
    messages = as_chat(path, body).get("messages")
    return isinstance(messages, list) and is_summary_request(messages)


def cached_prefix_tokens(previous: JSON | None, current: JSON, total: int) -> int:
    """Tokens of `current` (chat-shaped) equal to the start of `previous`: its tools and
    the messages the two share from the first; none when the tools differ."""
    if previous is None or previous.get("tools") != current.get("tools"):
        return 0
    before, now = previous.get("messages") or [], current.get("messages") or []
    shared = 0
    for old, new in zip(before, now, strict=False):
        if old != new:
            break
        shared += 1
    if shared == 0:
        return 0
    head = {"tools": current.get("tools"), "messages": now[:shared]}
    return min(total, estimate_prompt_tokens(head))
