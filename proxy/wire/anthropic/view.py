"""An Anthropic Messages request as the rewrite stages see it, and back.

The stages work on chat-shaped messages (roles, `tool_calls`, `tool` results). An Anthropic
history maps onto that shape message by message: the system prompt becomes a leading system
message; a user message's `tool_result` blocks become `tool` messages and its other blocks one
user message after them; an assistant message's text becomes its content and its `tool_use`
blocks its `tool_calls`. Each view message remembers the client's message it stands for.

Going back is lossless for everything the stages left alone: a view message that is still the
very object built here is replaced by the client's own blocks, byte for byte (thinking blocks
and their signatures, `cache_control`, citations, images, fields this code has never heard of).
Only what a stage changed or added is built anew, and even then each untouched block of the
message it came from is kept as it was: an offloaded `tool_result` keeps its `is_error` and
`cache_control`, a truncated `tool_use` keeps its id and every other block of its turn.

Incremental: a turn re-sends the last one's history plus new messages, so the memory of a
session's previous turn (memory.py) lends this one its view messages for every leading message
equal to the previous turn's (one `==` each); only the rest is mapped. A view message names its
client message and blocks by position, so what goes back upstream is always this turn's own
bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.exchange import NativeFit, NativePrefix
from proxy.messages import Message
from proxy.pipeline.context_edits import compaction_text
from proxy.pipeline.repair import is_synthetic
from proxy.policies.spec import Deployment
from proxy.wire.anthropic.memory import AnthropicMemory, Relayed
from proxy.wire.anthropic.memory import Origin as _Origin
from proxy.wire.anthropic.thinking import (
    dropped,
    loop_start,
    starts_with_thinking,
    thinking_on,
    without_thinking,
)
from proxy.wire.anthropic.upstream import speaks_anthropic
from proxy.wire.translate import chat_tools, shared_prefix, text_of_content

Block = dict[str, Any]
CACHE_BREAKPOINTS = 4  # Anthropic accepts at most four cache_control breakpoints per request
THINKING = ("thinking", "redacted_thinking")
MIN_THINKING_BUDGET = 1024  # Anthropic's least budget_tokens
AS_SENT = NativeFit()


@dataclass(frozen=True, slots=True)
class ThinkingRepair:
    """What putting back dropped thinking would do to a request: the tool_use ids of the
    assistant messages newly given their thinking back, how many the history carried on from
    earlier turns, and whether thinking must be off for this request."""

    restored: dict[int, tuple[Block, ...]]
    fresh: int  # messages given their thinking back this turn
    new_calls: list[str]  # ...their tool_use ids
    carried: int  # messages given it back on an earlier turn, again
    thinking_off: int | None  # the loop's first message, when thinking must be off

    def __bool__(self) -> bool:
        return bool(self.restored) or self.thinking_off is not None


@dataclass(slots=True)
class AnthropicView:
    body: dict[str, Any]  # the client's request, never mutated
    messages: list[Message] = field(default_factory=list)  # the view, in order
    _origins: dict[int, _Origin] = field(default_factory=dict)  # by id() of a view message
    # Replies the proxy continued itself (recall rounds), by their first tool_use id: a turn
    # the proxy added goes back with all of its blocks (thinking and its signature first).
    _turns: dict[str, list[Block]] = field(default_factory=dict)
    # The client's tools by id() of their chat-shaped twins (kept out of the chat tools, whose
    # JSON the stages count as the schemas' tokens).
    _tools: dict[int, dict[str, Any]] = field(default_factory=dict)
    # What chat_body() handed the stages (messages, tools, tool_choice), to see they left it.
    _untouched: tuple[Any, Any, Any] = (None, None, None)
    # The view as built, before any stage saw it: _ends[i] is its length after client message i.
    _built: list[Message] = field(default_factory=list)
    _ends: list[int] = field(default_factory=list)
    # The first message mapped here: those before it were lent by the session's last view,
    # whose turn checked them (proxy/wire/provider_objects.py walks only the rest).
    fresh: int = 0
    # What a fallback model cannot take of what the view does not show (exchange.NativeFit).
    _fit: NativeFit = AS_SENT
    # This turn, and how many of its messages the last view's repeat (for the recording).
    _prefix: NativePrefix = field(default_factory=lambda: NativePrefix("messages"))
    # The client message holding the history's last compaction block: what comes before it
    # is not part of the history (Anthropic drops it), and the block reads as a summary.
    cut: int | None = None
    # Thinking the client dropped, put back when rendered (proxy/wire/anthropic/thinking.py):
    # client message index -> the relayed blocks that go in front of it; lent on, like the
    # view messages, for the history the next turn shares.
    _restored: dict[int, tuple[Block, ...]] = field(default_factory=dict)
    _lent_restored: dict[int, tuple[Block, ...]] = field(default_factory=dict)
    _thinking_off: bool = False  # nothing to put back, and the loop needs it: thinking off
    # The session's name in TurnMemory: the one the client gave, which this turn's memory was
    # read under (the exchange's may differ: a lineage branch, a name that was an API key).
    memory_session: str = ""
    # Where the tool loop the request continues starts (thinking.loop_start), once looked at;
    # the last turn's, when this one continues its whole history.
    _loop: int | None = None
    _loop_seen: bool = False
    _loop_lent: tuple[int, int | None] | None = None  # (its history's length, its loop)

    @classmethod
    def of(cls, body: dict[str, Any], previous: AnthropicMemory | None = None) -> AnthropicView:
        """The view of `body`; `previous`, the memory of the session's last turn, lends it the
        view messages of the history the two share."""
        view = cls(body)
        system = body.get("system")
        if previous is not None and system and system == previous.system:
            view._add(previous.built[0], -1, None)  # the same prompt: the same view message
        elif system:
            view._add({"role": "system", "content": text_of_content(system)}, -1, None)
        messages = body["messages"]
        start = view._reuse(previous) if previous is not None else 0
        cut = last_compaction(messages, start)
        if cut is not None and start:  # a compaction new this turn: the history starts anew
            return cls.of(body)
        if cut is None and start and previous is not None and previous.cut is not None:
            cut = previous.cut if previous.cut < start else None  # the lent part starts there
        view.fresh, view.cut = start, cut
        for index in range(start, len(messages)):
            if cut is None or index > cut:
                view._map(index, messages[index])
            elif index == cut:
                view._map_compaction(index, messages[index])
            view._ends.append(len(view.messages))
        view._built = list(view.messages)
        return view

    @classmethod
    def opening(cls, body: dict[str, Any]) -> list[Message]:
        """The system prompt and the history up to its first user message, as the view has
        them: what names a session without an id (its beginning never changes)."""
        view = cls(body)
        if body.get("system"):
            view._add({"role": "system", "content": text_of_content(body["system"])}, -1, None)
        for index, message in enumerate(body["messages"]):
            view._map(index, message)
            if view.messages[-1].get("role") == "user":
                break
        return view.messages

    def _reuse(self, previous: AnthropicMemory) -> int:
        """Take the last turn's view messages for the leading client messages both turns
        share; how many those are."""
        shared = shared_prefix(self.body["messages"], previous.messages)
        if not shared:
            return 0
        self._prefix = NativePrefix("messages", self._prefix.turn, previous.turn, shared)
        built = previous.built
        before = 1 if built and previous.origins[id(built[0])].index < 0 else 0
        lent = built[before : previous.ends[shared - 1]]
        offset = len(self.messages) - before  # a system prompt gained or lost shifts the ends
        # The usual turn lends all of it, system prompt included: its origins copied in C.
        same_system = len(self.messages) == before and (not before or self.messages[0] is built[0])
        if same_system and len(lent) == len(built) - before:
            self._origins = dict(previous.origins)
        else:
            self._origins.update((id(m), previous.origins[id(m)]) for m in lent)
        self.messages += lent
        if previous.restored:
            self._lent_restored = {i: b for i, b in previous.restored.items() if i < shared}
        if previous.loop is not None and shared == previous.loop[0]:
            self._loop_lent = previous.loop
        ends = previous.ends[:shared]
        self._ends = ends if not offset else [end + offset for end in ends]
        return shared

    def memory(self) -> AnthropicMemory:
        """What this turn leaves the session's next (its thinking repaired, if it was)."""
        return AnthropicMemory(
            system=self.body.get("system"),
            messages=self.body["messages"],
            built=self._built,
            ends=self._ends,
            origins=self._origins,
            turn=self._prefix.turn,
            cut=self.cut,
            restored=self._restored,
            loop=(len(self.body["messages"]), self._loop) if self._loop_seen else None,
        )

    def thinking_repair(self, answers: Mapping[str, Relayed]) -> ThinkingRepair | None:
        """What putting back the thinking the client dropped would do (`answers`: what the
        proxy relayed to this session), with thinking on; None when nothing. Only the fresh
        messages are looked at: the shared history's come from the last turn's view."""
        if not thinking_on(self.body):
            return None
        messages = self.body["messages"]
        fresh = dropped(messages, self.fresh, answers)
        restored = {**self._lent_restored, **fresh}
        floor, before = self._loop_lent or (0, None)
        start = self._loop = loop_start(messages, floor, before)
        self._loop_seen = True
        if start is not None and starts_with_thinking(messages[start], restored.get(start)):
            start = None
        if not restored and start is None:
            return None
        calls = [b["id"] for i in fresh for b in messages[i]["content"] if _is_tool_use(b)]
        return ThinkingRepair(restored, len(fresh), calls, len(self._lent_restored), start)

    def repair_thinking(self, repair: ThinkingRepair) -> None:
        """Render from now on with `repair` applied."""
        self._restored = repair.restored
        self._thinking_off = repair.thinking_off is not None

    def restored_bytes(self) -> int:
        """What the blocks put back add to the request (the view memo counts them)."""
        return sum(
            len(str(v)) for blocks in self._restored.values() for b in blocks for v in b.values()
        )

    def chat_body(self) -> dict[str, Any]:
        """The chat-shaped request the stages rewrite (its messages are the view)."""
        chat: dict[str, Any] = {"model": self.body.get("model"), "messages": self.messages}
        tools = chat_tools(self.body.get("tools"), _chat_tool, self._tools)
        if tools:
            chat["tools"] = tools
        # No max_tokens: current Claude models do not count it against the window (Claude Code
        # asks for 32-128k on a 200k window), so the stages keep no room for it; the provider's
        # "input length and max_tokens exceed context limit" still triggers reactive compaction.
        choice = _chat_tool_choice(self.body.get("tool_choice"))
        if choice is not None:
            chat["tool_choice"] = choice
        self._untouched = (self.messages, chat.get("tools"), chat.get("tool_choice"))
        return chat

    @staticmethod
    def native_for(deployment: Deployment) -> bool:
        return speaks_anthropic(deployment)

    def translated(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The stages' output as a plain Chat Completions request, for a deployment that does
        not speak Anthropic (what this loses: thinking blocks, cache_control, citations and
        every other Anthropic-only field; images and documents pass as they are)."""
        out = dict(chat)
        for name in ("max_tokens", "temperature", "top_p", "stop_sequences"):
            if name in self.body:
                out["stop" if name == "stop_sequences" else name] = self.body[name]
        _clamp(out, self._fit.max_output_tokens)
        return out  # never streamed: a translated reply comes back whole (routes/anthropic.py)

    def reasoning(self) -> list[Block]:
        """The thinking blocks of the client's assistant turns, as sent."""
        return [
            block
            for message in self.body["messages"]
            if message.get("role") == "assistant" and isinstance(message.get("content"), list)
            for block in message["content"]
            if isinstance(block, dict) and block.get("type") in THINKING
        ]

    def output_limit(self) -> int | None:
        limit = self.body.get("max_tokens")
        return limit if isinstance(limit, int) else None

    def fit(self, fit: NativeFit) -> None:
        self._fit = AS_SENT if fit == AS_SENT else fit  # as sent: the client's own body again

    def native_prefix(self) -> NativePrefix:
        return self._prefix

    def remember_turn(self, content: list[Block]) -> None:
        """An assistant turn whose blocks must go back as they came (the client's own, or a
        reply the proxy continues itself), found again by its first tool_use id."""
        first = next((b.get("id") for b in content if b.get("type") == "tool_use"), None)
        if isinstance(first, str):
            self._turns[first] = content

    def render(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The native request for `chat` (the stages' output): the client's body with its
        system prompt, messages, tools and tool_choice as the stages left them."""
        if (chat["messages"], chat.get("tools")) == self._untouched[:2] and chat.get(
            "tool_choice"
        ) == self._untouched[2]:
            if self._fit is AS_SENT and not self._repaired:
                return self.body  # the common turn: nothing rewritten, the client's own body
            out = self._repaired_body(dict(self.body))
            out["messages"] = sent = list(self.body["messages"])
            for index in self._restored:
                sent[index] = self._client_message(index)
            return out if self._fit is AS_SENT else _fitted(out, self._fit)
        out = self._repaired_body(dict(self.body))
        messages: list[Message] = chat["messages"]
        start = 0
        if messages and messages[0].get("role") == "system":
            origin = self._origins.get(id(messages[0]))
            if origin is None or origin.index != -1:
                out["system"] = messages[0].get("content")  # rewritten: as text
            start = 1
        elif "system" in out:
            del out["system"]
        out["messages"] = list(self._native_messages(messages[start:]))
        if self.cut is not None:  # the compaction block and its turn's rest, one message again
            out["messages"] = self.body["messages"][: self.cut] + _rejoined(out["messages"])
        _render_tools(out, chat, self._tools)
        _cache_replacement(out, self.body["messages"])
        return out if self._fit is AS_SENT else _fitted(out, self._fit)

    @property
    def _repaired(self) -> bool:
        return bool(self._restored) or self._thinking_off

    def _repaired_body(self, out: dict[str, Any]) -> dict[str, Any]:
        return without_thinking(out) if self._thinking_off else out

    def _client_message(self, index: int) -> Message:
        """The client's message, with the thinking it dropped in front again."""
        message: Message = self.body["messages"][index]
        restored = self._restored.get(index)
        if restored is None:
            return message
        return {**message, "content": [*restored, *message["content"]]}

    # --- to the view --------------------------------------------------------------------------

    def _add(self, message: Message, index: int, blocks: tuple[int, ...] | None) -> None:
        self.messages.append(message)
        self._origins[id(message)] = _Origin(index, blocks)

    def _map_compaction(self, index: int, message: Message) -> None:
        """The message holding the history's compaction block: the block as a summary message
        (the history's new start), then its blocks after the block; those before it go."""
        content = message["content"]
        at = compaction_index(content)
        summary = {"role": "user", "content": compaction_text(content[at]["content"])}
        self._add(summary, index, (at,))
        if any(isinstance(b, dict) for b in content[at + 1 :]):
            self._map(index, message, after=at)

    def _map(self, index: int, message: Any, after: int = -1) -> None:
        role = message.get("role")
        content = message.get("content")
        if not isinstance(content, list):
            self._add({"role": role, "content": content}, index, None)
            return
        at = [i for i, b in enumerate(content) if isinstance(b, dict) and i > after]
        if role == "assistant":
            self._add(assistant_message([content[i] for i in at]), index, tuple(at))
            return
        rest: list[int] = []
        for i in at:
            block = content[i]
            if block.get("type") == "tool_result":
                result = {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": _result_content(block.get("content")),
                }
                self._add(result, index, (i,))
            else:
                rest.append(i)
        if rest or not at:
            parts = [_part(content[i]) for i in rest]
            self._add({"role": role, "content": parts}, index, tuple(rest))

    def _blocks(self, origin: _Origin) -> list[Block]:
        """The client's blocks a view message stands for, as this turn sent them."""
        content = self.body["messages"][origin.index]["content"]
        return [content[i] for i in origin.blocks or ()]

    # --- back to native -----------------------------------------------------------------------

    def _native_messages(self, view: list[Message]) -> Iterable[Message]:
        """Tool results and the user blocks after them travel together, as one user message;
        a view that is exactly one client message, untouched, is that message."""
        group: list[Message] = []
        for message in view:
            role = message.get("role")
            if role == "tool" or (role == "user" and group and group[-1].get("role") == "tool"):
                group.append(message)
                if role == "user":
                    yield self._user(group)
                    group = []
                continue
            if group:
                yield self._user(group)
                group = []
            yield self._native(message)
        if group:
            yield self._user(group)

    def _native(self, message: Message) -> Message:
        origin = self._origins.get(id(message))
        role = message.get("role")
        if origin is not None and origin.index >= 0:
            client: Message = self.body["messages"][origin.index]
            if origin.blocks is None or len(origin.blocks) == _block_count(client):
                return self._client_message(origin.index)  # the client's own, as sent
            return {**client, "content": self._blocks(origin)}
        if role == "assistant":
            return self._assistant_turn(message)
        if role == "system":  # a system message of the client's, rewritten; or a new one
            return {"role": "user", "content": text_of_content(message.get("content"))}
        return {"role": role or "user", "content": _native_content(message.get("content"))}

    def _user(self, group: list[Message]) -> Message:
        """Tool results (and the user blocks after them) as one user message."""
        origins = [self._origins.get(id(m)) for m in group]
        indexes = {o.index for o in origins if o is not None}
        if len(indexes) == 1 and all(o is not None for o in origins):
            index = indexes.pop()
            client: Message = self.body["messages"][index]
            kept = sum(len(o.blocks or ()) for o in origins if o is not None)
            if index >= 0 and kept == _block_count(client):
                return client  # every block of one client message, untouched
        blocks: list[Block] = []
        for message, origin in zip(group, origins, strict=True):
            if origin is not None and origin.blocks is not None:
                blocks += self._blocks(origin)
            elif message.get("role") == "tool":
                blocks.append(self._tool_result(message))
            else:
                blocks += _native_blocks(message.get("content"))
        return {"role": "user", "content": blocks}

    def _tool_result(self, message: Message) -> Block:
        """A tool result a stage rewrote (offloaded: the client's block with its new content)
        or made (repair's stand-in for a result that never came, an error; a recall answer)."""
        call_id = message.get("tool_call_id")
        content = _native_content(message.get("content"))
        original = self._client_result(call_id) if isinstance(call_id, str) else None
        if original is not None:
            return {**original, "content": content}
        block: Block = {"type": "tool_result", "tool_use_id": call_id, "content": content}
        if is_synthetic(message):
            block["is_error"] = True
        return block

    def _client_turn(self, first_call: str) -> list[Block] | None:
        """The blocks of the turn whose first tool_use is `first_call`: a reply the proxy
        continued, else one of the client's (looked up only when a turn was rewritten)."""
        if first_call in self._turns:
            return self._turns[first_call]
        for index, message in enumerate(self.body["messages"]):
            content = message.get("content")
            if message.get("role") != "assistant" or not isinstance(content, list):
                continue
            first = next(
                (
                    b.get("id")
                    for b in content
                    if isinstance(b, dict) and b.get("type") == "tool_use"
                ),
                None,
            )
            if first == first_call:
                restored = self._restored.get(index, ())
                return [*restored, *(b for b in content if isinstance(b, dict))]
        return None

    def _client_result(self, call_id: str) -> Block | None:
        """The client's tool_result block for `call_id` (looked up only when one was rewritten)."""
        for message in self.body["messages"]:
            content = message.get("content")
            if message.get("role") != "user" or not isinstance(content, list):
                continue
            for block in content:
                if (
                    isinstance(block, dict)
                    and block.get("tool_use_id") == call_id
                    and block.get("type") == "tool_result"
                ):
                    return block
        return None

    def _assistant_turn(self, message: Message) -> Message:
        """An assistant message a stage rewrote (truncated arguments) or the proxy added (a
        recall round): its blocks as they came, each tool_use with its call's input now."""
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        first = calls[0].get("id") if calls else None
        blocks = self._client_turn(first) if isinstance(first, str) else None
        if blocks is None:
            fresh: list[Block] = []
            if message.get("content"):
                fresh.append({"type": "text", "text": text_of_content(message["content"])})
            fresh += [_tool_use(call, None) for call in calls]
            return {"role": "assistant", "content": fresh}
        by_id = {c.get("id"): c for c in calls}
        out: list[Block] = []
        for block in blocks:
            if block.get("type") != "tool_use":
                out.append(block)
            elif (call := by_id.get(block.get("id"))) is not None:
                out.append(_tool_use(call, block))
            # else: a call the stages took out of the turn
        return {"role": "assistant", "content": _with_text(out, message.get("content"))}


REPLACEMENT_MARK = "[agentproxy] "  # how compaction's summaries and markers begin


def compaction_index(content: Any) -> int:
    """The position of the last compaction block with a summary in `content`, or -1 (a block
    whose content is null is a failed compaction: a no-op)."""
    if not isinstance(content, list):
        return -1
    for i in range(len(content) - 1, -1, -1):
        block = content[i]
        if (
            isinstance(block, dict)
            and block.get("type") == "compaction"
            and isinstance(block.get("content"), str)
        ):
            return i
    return -1


def last_compaction(messages: list[Message], start: int = 0) -> int | None:
    """The index of the last message from `start` on that holds a compaction block."""
    for index in range(len(messages) - 1, start - 1, -1):
        if compaction_index(messages[index].get("content")) >= 0:
            return index
    return None


def _rejoined(messages: list[Message]) -> list[Message]:
    """A compaction block rendered on its own, then the rest of its turn: one message."""
    if len(messages) < 2:
        return messages
    first, second = messages[0], messages[1]
    content = first.get("content")
    if (
        first.get("role") == second.get("role")
        and isinstance(content, list)
        and len(content) == 1
        and compaction_index(content) == 0
        and isinstance(second.get("content"), list)
    ):
        return [{**second, "content": [*content, *second["content"]]}, *messages[2:]]
    return messages


def _cache_replacement(out: dict[str, Any], client: list[Message]) -> None:
    """After a compaction, the summary (or middle-out marker) ends the prefix every later turn
    shares: a cache breakpoint there lets the provider cache the compacted history. Only when
    the request has a breakpoint to spare (Anthropic accepts four)."""
    messages: list[Message] = out["messages"]
    at = next(
        (
            i
            for i, m in enumerate(messages[:3])
            if not any(m is c for c in client)
            and text_of_content(m.get("content")).startswith(REPLACEMENT_MARK)
        ),
        None,
    )
    if at is None or _breakpoints(out) >= CACHE_BREAKPOINTS:
        return
    blocks = _native_blocks(messages[at].get("content"))
    if blocks:
        blocks = [*blocks[:-1], {**blocks[-1], "cache_control": {"type": "ephemeral"}}]
        messages[at] = {**messages[at], "content": blocks}


def _breakpoints(out: dict[str, Any]) -> int:
    def marked(blocks: Any) -> int:
        if not isinstance(blocks, list):
            return 0
        return sum(1 for b in blocks if isinstance(b, dict) and "cache_control" in b)

    count = marked(out.get("system")) + marked(out.get("tools"))
    count += "cache_control" in out  # a request-level breakpoint takes a slot too
    return count + sum(marked(m.get("content")) for m in out["messages"])


def _is_tool_use(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_use"


def _block_count(client: Message) -> int:
    content = client.get("content")
    return len([b for b in content if isinstance(b, dict)]) if isinstance(content, list) else 0


def assistant_message(blocks: list[Block]) -> Message:
    """An assistant turn's blocks as a chat message: its text, and its tool_use blocks as calls."""
    texts = [
        b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str)
    ]
    calls = [
        {
            "id": b.get("id"),
            "type": "function",
            "function": {
                "name": b.get("name"),
                "arguments": orjson.dumps(b.get("input", {})).decode(),
            },
        }
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    message: Message = {"role": "assistant", "content": "\n".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _with_text(blocks: list[Block], text: Any) -> list[Block]:
    """The turn's blocks with its text as a stage left it (the guard's placeholders): the
    first text block carries it all, the others go; untouched text keeps the blocks."""
    texts = [b for b in blocks if b.get("type") == "text"]
    if not texts or not isinstance(text, str):
        return blocks
    if "\n".join(str(b.get("text")) for b in texts) == text:
        return blocks
    first = texts[0]
    return [
        {**b, "text": text} if b is first else b
        for b in blocks
        if b.get("type") != "text" or b is first
    ]


def _tool_use(call: dict[str, Any], original: Block | None) -> Block:
    function = call.get("function") or {}
    arguments = function.get("arguments") or "{}"
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        value = {"arguments": arguments}  # a rewrite left no JSON object: keep its text
    if not isinstance(value, dict):
        value = {"arguments": value}
    block: Block = dict(original) if original is not None else {"type": "tool_use"}
    block.update({"id": call.get("id"), "name": function.get("name"), "input": value})
    return block


def _result_content(content: Any) -> Any:
    if isinstance(content, list):
        return [_part(b) for b in content if isinstance(b, dict)]
    return content


def _part(block: Block) -> Block:
    """A content block as a chat part: text stays text (the stages read it), the rest as is."""
    if block.get("type") == "text":
        return {"type": "text", "text": block.get("text", "")}
    return block


def _native_content(content: Any) -> Any:
    if isinstance(content, list):
        return _native_blocks(content)
    return content if isinstance(content, str) else ""


def _native_blocks(content: Any) -> list[Block]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict)]


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.get("name")}
    if "description" in tool:
        function["description"] = tool["description"]
    if "input_schema" in tool:
        function["parameters"] = tool["input_schema"]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"any": "required", "none": "none", "auto": "auto"}.get(str(kind))


def _render_tools(
    out: dict[str, Any], chat: dict[str, Any], natives: dict[int, dict[str, Any]]
) -> None:
    """Tools and tool_choice as the stages left them: the client's own tools as sent, the
    proxy's recall tool in Anthropic's form, "none" when a guard took tool use away."""
    tools = chat.get("tools")
    if tools:
        native = []
        for tool in tools:
            if id(tool) in natives:
                native.append(natives[id(tool)])
            else:
                function = tool.get("function") or {}
                native.append(
                    {
                        "name": function.get("name"),
                        "description": function.get("description", ""),
                        "input_schema": function.get("parameters") or {"type": "object"},
                    }
                )
        out["tools"] = native
    elif "tools" in out:
        del out["tools"]
        out.pop("tool_choice", None)  # a choice among no tools is refused
    if chat.get("tool_choice") == "none" and out.get("tools"):
        out["tool_choice"] = {"type": "none"}


def _fitted(out: dict[str, Any], fit: NativeFit) -> dict[str, Any]:
    """The rendered request without what a fallback model cannot take: thinking blocks (an
    assistant turn that was nothing else is left out), and then the thinking setting too (a
    turn that must start with thinking no longer does); output beyond its limit."""
    if fit.drop_reasoning:
        kept = (_without_thinking(m) for m in out["messages"])
        out["messages"] = [m for m in kept if m is not None]
    if fit.drop_reasoning or fit.drop_reasoning_setting:
        out.pop("thinking", None)
    _clamp(out, fit.max_output_tokens)
    thinking = out.get("thinking")
    limit = out.get("max_tokens")
    if isinstance(thinking, dict) and isinstance(limit, int):
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and budget >= limit:  # the budget must stay below max_tokens
            if limit // 2 >= MIN_THINKING_BUDGET:
                out["thinking"] = {**thinking, "budget_tokens": limit // 2}
            else:
                del out["thinking"]
    return out


def _without_thinking(message: Message) -> Message | None:
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return message
    kept = [b for b in content if not (isinstance(b, dict) and b.get("type") in THINKING)]
    if len(kept) == len(content):
        return message
    return {**message, "content": kept} if kept else None


def _clamp(out: dict[str, Any], limit: int | None) -> None:
    asked = out.get("max_tokens")
    if limit is not None and isinstance(asked, int) and asked > limit:
        out["max_tokens"] = limit
