"""What a provider's error says of a context overflow: whether it is one, and the prompt and
window it states in the provider's own tokens. Read by control (classifying a failure, learning
a window) and by compaction (recovering from one); it knows nothing of either."""

from __future__ import annotations

import re

# Lower-case fragments of the providers' "context exceeded" errors. litellm's
# ContextWindowExceededError reaches the client with code "context_length_exceeded".
OVERFLOW_TEXTS = (
    "context_length_exceeded",
    "maximum context length",
    "prompt is too long",
    "input length and `max_tokens` exceed context limit",
    "input tokens exceed the configured limit",
    "exceeds the context window",
    "contextwindowexceedederror",
)
SCAN_BYTES = 64 * 1024  # error bodies are small; never lower-case a megabyte of HTML


# What some providers say of an overflow, in their own tokens: the prompt they counted and
# the window (OpenAI's context length counts the completion too, as a budget's window does).
STATED_PROMPT = (
    re.compile(r"resulted in (\d+) tokens"),
    re.compile(r"\((\d+) in the messages"),
    re.compile(r"prompt is too long: (\d+) tokens"),
    re.compile(r"exceed context limit: (\d+) \+"),
)
STATED_WINDOW = (
    re.compile(r"maximum context length is (\d+) tokens"),
    re.compile(r"tokens > (\d+) maximum"),
    re.compile(r"exceed context limit: \d+ \+ \d+ > (\d+)"),
    re.compile(r"configured limit of (\d+) tokens"),
)


def stated_tokens(body: bytes) -> tuple[int | None, int | None]:
    """(prompt, window) as an overflow error states them in the provider's tokens, each None
    when it does not say."""
    text = body[:SCAN_BYTES].decode("utf-8", "replace").lower()
    return _first(STATED_PROMPT, text), _first(STATED_WINDOW, text)


def _first(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for pattern in patterns:
        if (found := pattern.search(text)) is not None:
            return int(found.group(1))
    return None


def is_context_overflow(status: int, body: bytes) -> bool:
    if status < 400:
        return False
    text = body[:SCAN_BYTES].decode("utf-8", "replace").lower()
    return any(fragment in text for fragment in OVERFLOW_TEXTS)
