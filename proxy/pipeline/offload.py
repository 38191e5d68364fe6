"""Offload large tool results: store the full text first, leave a pointer with a preview.

The pointer is a pure function of (content, session, tool name, call id, spec, recall on/off),
so the same tool message becomes byte-identical text on every later turn and after a restart.
Per turn, a message costs one length check unless it is large; a large one costs one hash
(its reference) and, once seen, a cache hit instead of a store write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from proxy.exchange import Exchange
from proxy.messages import Message, call_name, estimate_tokens
from proxy.pipeline.archive import Entry, ref_of
from proxy.pipeline.base import StageContext, forget_sessions, record, reusable
from proxy.policies.spec import OffloadSpec, Policy

KIND = "tool_result"
# The cheap pre-check assumes at least this many characters per token: below
# min_tokens * 3 chars a message cannot reach the threshold under any sane calibration.
MIN_CHARS_PER_TOKEN = 3
# The size line in the pointer uses a fixed ratio, not the calibrated estimate: a calibration
# change must never change the text of an old pointer (stability law).
POINTER_CHARS_PER_TOKEN = 4
RECALL_TOOL = "agentproxy_recall"
ARCHIVE_PATH = "/v1/agentproxy/archive/"

_KEPT_KEYS = ("role", "tool_call_id", "name")  # what the pointer message keeps of the original
PointerKey = tuple[str, str, str, str, OffloadSpec, bool]  # session, ref, tool, call, spec, recall


@dataclass(frozen=True, slots=True)
class _Candidate:
    index: int
    content: str
    data: bytes
    ref: str
    tool: str
    call_id: str
    tokens: int  # estimate of the original message


@dataclass(frozen=True, slots=True)
class _Offloaded:
    refs: tuple[str, ...] = ()
    tokens_before: int = 0
    tokens_after: int = 0

    def plus(self, other: _Offloaded) -> _Offloaded:
        return _Offloaded(
            self.refs + other.refs,
            self.tokens_before + other.tokens_before,
            self.tokens_after + other.tokens_after,
        )


@dataclass(frozen=True, slots=True)
class _Turn:
    size: int  # bytes of the request it came from: what the memo is bounded by
    length: int  # how many input messages `output` covers
    output: list[Message]
    offloaded: _Offloaded
    settings: tuple[OffloadSpec, bool, int]  # spec, recall, threshold
    basis: object | None  # the turn it was computed on (ex.rewrite.turn)


class OffloadStage:
    name = "offload"
    # Only tool messages' contents change (role and tool_call_id are kept): the pairing of
    # calls and results is untouched, so the chain need not re-check it.
    preserves_pairing = True

    def __init__(
        self, pointer_bytes: int = 16 * 1024 * 1024, memo_bytes: int = 64 * 1024 * 1024
    ) -> None:
        # Pointer texts already built (and stored) in this process; entries are ~1-10 kB.
        self._pointers: LRUCache[PointerKey, str] = LRUCache(
            pointer_bytes, getsizeof=lambda text: len(text) + 256
        )
        # Per session, last turn's result: the part of the history it covered is not scanned
        # again when the client re-sends it unchanged.
        # Bounded by the request bytes they stand for (the lists keep the messages alive).
        self._last: LRUCache[str, _Turn] = LRUCache(memo_bytes, getsizeof=lambda t: t.size)

    def memos(self) -> dict[str, LRUCache[Any, Any]]:
        return {"offload_turns": self._last, "offload_pointers": self._pointers}

    def forget(self, sessions: set[str]) -> None:
        forget_sessions(sessions, named=[self._last], led=[self._pointers])

    def enabled(self, policy: Policy) -> bool:
        return policy.offload.enabled

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        spec = ex.policy.offload
        recall = ex.policy.recall.enabled
        threshold = _threshold(ex, ctx)
        last = self._last.pop(ex.identity.session, None)
        if (
            last is None
            or last.length > reusable(ex, messages, last.basis)
            or last.settings != (spec, recall, threshold)
        ):
            last = _Turn(0, 0, [], _Offloaded(), (spec, recall, threshold), None)
        out, offloaded, failed = await self._scan(ex, messages, ctx, last.length, threshold)
        if last.length:
            out[: last.length] = last.output
            offloaded = last.offloaded.plus(offloaded)
        size = max(1, ex.client.body_bytes or 64 * len(messages))
        # A failed write is retried next turn: it must rescan.
        # Its input is the client's list, index for index, only if no earlier stage changed it.
        if messages is ex.messages and not failed and size <= self._last.maxsize:
            settings = (spec, recall, threshold)
            self._last[ex.identity.session] = _Turn(
                size, len(messages), out, offloaded, settings, ex.rewrite.turn
            )
        if not offloaded.refs:
            return None
        record(
            ex,
            ctx,
            self.name,
            "offloaded",
            count=len(offloaded.refs),
            tokens_before=offloaded.tokens_before,
            tokens_after=offloaded.tokens_after,
            refs=list(offloaded.refs),
        )
        return out

    async def _scan(
        self,
        ex: Exchange,
        messages: list[Message],
        ctx: StageContext,
        start: int,
        threshold: int,
    ) -> tuple[list[Message], _Offloaded, bool]:
        """Offload what needs it in messages[start:]. Returns (all messages with pointers in
        place, what was offloaded here, whether a store write failed)."""
        spec = ex.policy.offload
        recall = ex.policy.recall.enabled
        min_chars = threshold * MIN_CHARS_PER_TOKEN
        candidates: list[_Candidate] = []
        out = list(messages)
        for index in range(start, len(messages)):
            message = messages[index]
            if message.get("role") != "tool":
                continue
            content = message.get("content")
            if isinstance(content, str) and len(content) < min_chars:
                continue  # the common case, checked inline: this loop runs every turn
            content = _text_content(message, min_chars)
            if content is None:
                continue
            tokens = estimate_tokens(message)
            if tokens <= threshold:
                continue
            data = content.encode()
            call_id = str(message.get("tool_call_id") or "")
            tool = _tool_name(messages, index, call_id)
            ref = ref_of(ex, KIND, data)
            candidates.append(_Candidate(index, content, data, ref, tool, call_id, tokens))
        if not candidates:
            return out, _Offloaded(), False

        pointers: dict[int, str] = {}
        to_store: list[tuple[_Candidate, PointerKey, str]] = []
        for c in candidates:
            key: PointerKey = (ex.identity.session, c.ref, c.tool, c.call_id, spec, recall)
            cached = self._pointers.get(key)
            if cached is not None:  # decided on an earlier turn: "" = not worth it
                if cached:
                    pointers[c.index] = cached
                continue
            text = pointer_text(c.content, c.ref, c.tool, c.call_id, spec, recall=recall)
            if len(text) < len(c.content):
                to_store.append((c, key, text))
            else:  # a pointer as long as the result (tiny thresholds) helps nobody
                self._pointers[key] = ""

        failed = False
        if to_store:  # recoverable law: stored durably before its message is replaced
            stored = await ctx.archive.keep(ex, self.name, [_entry(c) for c, _, _ in to_store])
            for c, key, text in to_store:
                if c.ref in stored:  # a failed write leaves the result whole, uncached
                    self._pointers[key] = text
                    pointers[c.index] = text
                else:
                    failed = True
        tokens_before = tokens_after = 0
        refs: list[str] = []
        for c in candidates:
            pointer = pointers.get(c.index)
            if pointer is None:
                continue
            original = messages[c.index]
            replaced: Message = {k: original[k] for k in _KEPT_KEYS if k in original}
            replaced["content"] = pointer
            out[c.index] = replaced
            tokens_before += c.tokens
            tokens_after += estimate_tokens(replaced)
            refs.append(c.ref)
        return out, _Offloaded(tuple(refs), tokens_before, tokens_after), failed


def _entry(c: _Candidate) -> Entry:
    lines = _lines(c.content)
    meta = {
        "tool": c.tool,
        "tool_call_id": c.call_id,
        "chars": len(c.content),
        "lines": len(lines),
        "tokens": c.tokens,
    }
    return Entry(c.ref, KIND, c.data, meta)


def _text_content(message: Message, min_chars: int) -> str | None:
    """The text to offload, or None when the message is small or not plain text."""
    content = message.get("content")
    if isinstance(content, str):
        return content if len(content) >= min_chars else None
    if not isinstance(content, list) or not content:
        return None
    texts: list[str] = []
    for part in content:
        # An image or file part would not survive as text: such messages stay as they are.
        if not isinstance(part, dict) or part.get("type") != "text":
            return None
        text = part.get("text")
        if not isinstance(text, str):
            return None
        texts.append(text)
    if sum(map(len, texts)) < min_chars:
        return None
    return "\n".join(texts)  # joined as messages.text_of does, which the estimate counts


def _tool_name(messages: list[Message], index: int, call_id: str) -> str:
    """The name from the assistant call this result answers (the block right before it)."""
    i = index - 1
    while i >= 0 and messages[i].get("role") == "tool":
        i -= 1
    if i >= 0 and messages[i].get("role") == "assistant":
        for call in messages[i].get("tool_calls") or []:
            matches = isinstance(call, dict) and call.get("id") == call_id
            if matches and isinstance(name := call_name(call), str):
                return name
    name = messages[index].get("name")
    return name if isinstance(name, str) and name else "unknown"


def _lines(content: str) -> list[str]:
    lines = content.split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()  # a trailing newline ends the last line; it does not start a new one
    return lines


def pointer_text(
    content: str, ref: str, tool: str, call_id: str, spec: OffloadSpec, *, recall: bool = True
) -> str:
    """What the model sees instead of the result. Pure: same inputs, same bytes."""
    lines = _lines(content)
    tokens = -(-len(content) // POINTER_CHARS_PER_TOKEN)
    if recall:
        how = (
            f'To read it, call the {RECALL_TOOL} tool with {{"ref": "{ref}"}}, or search this '
            f'session\'s archive with {{"query": "<phrase>"}}; people can GET {ARCHIVE_PATH}{ref}.'
        )
    else:
        how = f"People can read it with GET {ARCHIVE_PATH}{ref}."
    out = [
        "[agentproxy] This tool result was offloaded to keep the context small.",
        f"tool: {tool}   call: {call_id}   "
        f"size: {len(content):,} chars, {len(lines):,} lines (~{tokens:,} tokens)",
        f"reference: {ref}",
        how,
    ]
    keep = spec.preview_lines
    if keep <= 0:
        return "\n".join(out)
    if len(lines) <= 2 * keep:
        shown = list(enumerate(lines, 1))
        out.append(f"Preview (all {len(lines):,} lines):")
    else:
        shown = [*enumerate(lines[:keep], 1), *enumerate(lines[-keep:], len(lines) - keep + 1)]
        out.append(f"Preview (first {keep} and last {keep} lines):")
    omitted = len(lines) - len(shown)
    for number, line in shown:
        if omitted and number == len(lines) - keep + 1:
            out.append(f"{'…':>6}  ({omitted:,} lines omitted)")
        out.append(f"{number:>6}  {_cut(line.rstrip(chr(13)), spec.line_chars)}")
    return "\n".join(out)


def _cut(line: str, limit: int) -> str:
    if len(line) <= limit:
        return line
    return f"{line[:limit]}… (+{len(line) - limit:,} chars)"


def _threshold(ex: Exchange, ctx: StageContext) -> int:
    """Tokens above which a result is offloaded: min_tokens, or less on a small model (a
    20k-token result cannot stay in an 8k window)."""
    spec = ex.policy.offload
    window = ctx.catalog.facts(ex.deployment).max_input_tokens if ex.deployment else None
    if not window:
        return spec.min_tokens
    return max(1, min(spec.min_tokens, int(spec.max_window_share * window)))
