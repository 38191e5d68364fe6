"""The session's intent: what the user asked for, kept verbatim beside every summary.

A summarizer (a small model above all) may drop the goal, or declare it achieved; so the intent
is never left to it. Every compaction's replacement is `[*intent, body]`, the body being the
summary or the middle-out marker, and the next compaction carries those intent messages
forward as they are, byte for byte: the goal reaches the model in every request.

- By default the intent is the session's first user message, as sent.
- With `compaction.intent` (a regular expression, e.g. "^GOAL:.*"), it is the lines of user
  messages it finds, each once, in order, gathered into one message; lines found in a later
  stretch join at the next compaction. When it finds none, the first user message it is.

Bounded: an intent over INTENT_WINDOW_SHARE of the window keeps its start and end; the whole is
in the archive with the rest of the stretch (its reference is given).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from proxy import messages as msgs
from proxy.messages import Message, text_of
from proxy.pipeline.compaction.budget import message_tokens

INTENT_HEADER = "[agentproxy] The session's intent, as the user stated it:"
INTENT_CUT = (
    "\n\n[agentproxy] … {chars} characters of this message were cut to fit the context "
    "window; it is archived in full as {ref} …\n\n"
)
INTENT_WINDOW_SHARE = 0.15


def intent_of(
    previous: Sequence[Message],
    raw: Sequence[Message],
    pattern: str | None,
    window: int,
    ref: str,
) -> list[Message]:
    """The intent messages of a replacement. `previous`: the earlier replacement this stretch
    starts with (its intent is carried forward); `raw`: the stretch's own messages."""
    carried = list(previous[:-1])  # an earlier replacement is [*intent, summary or marker]
    if pattern is not None:
        lines = _lines(carried, pattern) + _lines(raw, pattern)
        if lines:
            text = "\n".join([INTENT_HEADER, *dict.fromkeys(lines)])
            return [bounded({"role": "user", "content": text}, window, ref)]
    if previous:
        return carried  # verbatim, as the earlier compaction chose it
    first = next((m for m in raw if m.get("role") == "user"), None)
    return [bounded(first, window, ref)] if first is not None else []


def bounded(message: Message, window: int, ref: str) -> Message:
    """`message` itself when it is small enough, else its start and end around a note."""
    cap = int(INTENT_WINDOW_SHARE * window)
    if message_tokens(message) <= cap:
        return message
    text = text_of(message)
    keep = max(0, int((cap - msgs.TOKENS_PER_MESSAGE) * msgs.CHARS_PER_TOKEN) - 200) // 2
    note = INTENT_CUT.format(chars=len(text) - 2 * keep, ref=ref)
    return {"role": "user", "content": f"{text[:keep]}{note}{text[len(text) - keep :]}"}


def _lines(messages: Sequence[Message], pattern: str) -> list[str]:
    found = _compiled(pattern)
    lines: list[str] = []
    for message in messages:
        if message.get("role") != "user":
            continue
        text = text_of(message)
        if text.startswith(INTENT_HEADER):  # an earlier intent message: its lines as they are
            lines += text[len(INTENT_HEADER) :].strip("\n").splitlines()
        else:
            lines += [match.group(0).strip() for match in found.finditer(text)]
    return [line for line in lines if line]


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.MULTILINE)
