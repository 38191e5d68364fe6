"""Token arithmetic for fitting a history into a window: estimates, budgets and cut points.

Pure functions. The per-message estimate is the one `proxy.messages.estimate_tokens` gives,
computed from a few len() calls instead of building the joined text: it is cheaper than
hashing the message, so the early exit needs no cache at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy import messages as msgs
from proxy.exchange import Exchange
from proxy.messages import Message
from proxy.pipeline.base import StageContext
from proxy.tokens.parts import part_tokens

HEAD_ROLES = ("system", "developer")


def message_tokens(message: Message) -> int:
    """Equal to estimate_tokens(message), without copying any text."""
    content = message.get("content")
    if content.__class__ is str and not message.get("tool_calls"):  # the common case, fast
        return msgs.TOKENS_PER_MESSAGE + int(len(content) / msgs.CHARS_PER_TOKEN + 0.999)
    parts = chars = other = 0
    if isinstance(content, str):
        parts, chars = 1, len(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(text := part.get("text"), str):
                parts += 1
                chars += len(text)
            elif isinstance(part, dict):
                other += part_tokens(part)  # images, documents, audio
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts += 2
            chars += len(str(function.get("name", ""))) + len(str(function.get("arguments", "")))
    if parts:
        chars += parts - 1  # text_of joins its parts with one newline each
    return msgs.TOKENS_PER_MESSAGE + int(chars / msgs.CHARS_PER_TOKEN + 0.999) + other


def tokens_of(messages: Sequence[Message]) -> int:
    return sum(map(message_tokens, messages))


def schema_tokens(tools: Any) -> int:
    """Tool schemas count against the window too: their JSON at the same chars per token."""
    if not isinstance(tools, list) or not tools:
        return 0
    return int(len(orjson.dumps(tools)) / msgs.CHARS_PER_TOKEN + 0.999)


def reserved_output(body: dict[str, Any]) -> int:
    """Room the request asks to keep for the answer (max_completion_tokens wins, as at OpenAI)."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


@dataclass(frozen=True, slots=True)
class Budget:
    window: int  # the target model's max input tokens
    available: int  # window minus the reserved output: what prompt + tools may use
    fixed: int  # tokens of the tool schemas, paid on every turn

    def limit(self, fraction: float) -> int:
        return int(fraction * self.available)

    def scaled(self, factor: float, fixed: int) -> Budget:
        """The budget in the units of a measure whose every unit is `factor` provider tokens
        (pipeline/meter.py), the tool schemas measured as `fixed`."""
        if factor == 1.0:
            return Budget(self.window, self.available, fixed)
        return Budget(int(self.window / factor), int(self.available / factor), fixed)

    def capped(self, window: int | None) -> Budget:
        """The budget when the provider is known to overflow at `window` tokens, prompt and
        the answer's reservation together. A window this request's reservation alone fills
        leaves the budget as it is: no rewrite of the prompt could help."""
        reserved = self.window - self.available
        if window is None or window >= self.window or window <= reserved:
            return self
        return Budget(window, window - reserved, self.fixed)


def budget_for(ex: Exchange, ctx: StageContext, window: int | None = None) -> Budget | None:
    """None when the target's window is unknown (then there is nothing to fit to)."""
    if window is None:
        if ex.deployment is None:
            return None
        window = ctx.catalog.facts(ex.deployment).max_input_tokens
    if not window:
        return None
    available = window - reserved_output(ex.body)
    if available <= 0:
        return None  # the answer alone overflows; no rewrite of ours can help
    return Budget(window, available, schema_tokens(ex.body.get("tools")))


def head_length(messages: Sequence[Message]) -> int:
    """The leading system/developer prompts: always kept, never summarized."""
    n = 0
    while n < len(messages) and messages[n].get("role") in HEAD_ROLES:
        n += 1
    return n


def recent_start(
    costs: Sequence[int], base: int, keep_tokens: int, keep_messages: int | None
) -> int:
    """Where the verbatim recent part begins: the shortest suffix holding `keep_tokens`
    (or `keep_messages` messages), but never less than the last message. `costs` holds
    each message's token estimate."""
    end = len(costs)
    if keep_messages is not None:
        return max(base, min(end - 1, end - keep_messages))
    kept, index = 0, end
    while index > base and kept < keep_tokens:
        index -= 1
        kept += costs[index]
    return max(base, min(index, end - 1))


def choose_cut(messages: Sequence[Message], base: int, latest: int) -> int | None:
    """A cut c in (base, latest]: messages[base:c] are replaced, messages[c:] kept verbatim.

    A tool message never starts the kept part (that would split it from its call). A user
    message is the best start (the kept part then opens a turn), unless choosing it would
    give up more than half of what could be summarized; then any other role will do."""
    best_user = best_any = None
    for index in range(latest, base, -1):
        role = messages[index].get("role")
        if role == "tool":
            continue
        if best_any is None:
            best_any = index
        if role == "user":
            best_user = index
            break
    if best_user is not None and best_any is not None and best_user - base >= (best_any - base) / 2:
        return best_user
    return best_any
