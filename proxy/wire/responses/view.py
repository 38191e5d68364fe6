"""An OpenAI Responses request as the rewrite stages see it, and back.

The input items map onto chat-shaped messages: `instructions` and system/developer messages
lead, message items are messages, a run of `function_call` / `custom_tool_call` items is one
assistant turn with `tool_calls`, each `*_output` item a `tool` result. Items the stages have no
word for (reasoning with its `encrypted_content`, web searches, `additional_tools`, anything
new) ride along with the view message after them, so they go back where they were.

Going back is lossless for everything the stages left alone: a view message still the very
object built here is replaced by its items as the client sent them. What a stage changed keeps
its other fields (an offloaded output keeps its call_id and type; a truncated call its id and
status); what a stage added is built in the Responses form (repair's synthetic output, a
summary as a user message, the proxy's recall call and its answer).

Incremental: the memory of a session's previous turn (memory.py) lends this one its view
messages for the leading input items both turns share (one `==` each, up to the last message
boundary inside them); only the rest is mapped. View messages name their items by position, so
what goes back upstream is always this turn's own items.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from proxy.exchange import NativeFit, NativePrefix
from proxy.messages import Message
from proxy.policies.spec import Deployment
from proxy.upstream.facts import DeploymentFacts
from proxy.wire.responses.compaction_items import is_minted
from proxy.wire.responses.memory import ResponsesMemory
from proxy.wire.responses.upstream import speaks_responses
from proxy.wire.translate import chat_tools, shared_prefix, text_of_content

Item = dict[str, Any]
CALLS = ("function_call", "custom_tool_call")
OUTPUTS = {"function_call_output": "function_call", "custom_tool_call_output": "custom_tool_call"}
TEXT_PARTS = ("input_text", "output_text", "text")
ENCRYPTED_REASONING = "reasoning.encrypted_content"  # what `include` asks to get them back
AS_SENT = NativeFit()
KEPT_ROLES = ("system", "developer", "user")  # what a compacted window keeps before its item


def compact_threshold(body: dict[str, Any]) -> int | None:
    """`context_management: [{"type": "compaction", "compact_threshold": N}]`: N (0 when the
    entry gives none: compact whenever asked); None without such an entry."""
    entries = body.get("context_management")
    if not isinstance(entries, list):
        return None
    for entry in entries:
        if isinstance(entry, dict) and entry.get("type") == "compaction":
            threshold = entry.get("compact_threshold")
            return threshold if isinstance(threshold, int) and threshold > 0 else 0
    return None


@dataclass(slots=True)
class ResponsesView:
    body: dict[str, Any]  # the client's request, never mutated
    messages: list[Message] = field(default_factory=list)
    _origins: dict[int, list[int]] = field(default_factory=dict)  # view id() -> item indexes
    _items: list[Item] = field(default_factory=list)  # the client's input as a list
    _calls: dict[str, int] = field(default_factory=dict)  # call_id -> its call item's index
    _outputs: dict[str, int] = field(default_factory=dict)  # call_id -> its output's index
    # Output items of replies the proxy continued itself (recall rounds), by first call_id.
    _turns: dict[str, list[Item]] = field(default_factory=dict)
    _tail: list[int] = field(default_factory=list)  # unmapped items after the last message
    _tools: dict[int, dict[str, Any]] = field(default_factory=dict)  # chat tool id() -> native
    # What chat_body() handed the stages (messages, tools, tool_choice), to see they left it.
    _untouched: tuple[Any, Any, Any] = (None, None, None)
    _instructions: Message | None = None
    # The view as built, before any stage saw it, and where its messages end: after item
    # _ends[k][0] - 1 the view had _ends[k][1] messages and no item waiting for the next one.
    _built: list[Message] = field(default_factory=list)
    _ends: list[tuple[int, int]] = field(default_factory=list)
    _repeated_ids: bool = False  # a call_id seen twice: its index maps cannot be lent
    # Ids of stored items the input names instead of sending (`item_reference`), among the
    # items mapped here: a lent prefix was checked on its own turn.
    references: list[Any] = field(default_factory=list)
    # The first input item mapped here: those before it were lent by the session's last view,
    # whose turn checked them (proxy/wire/provider_objects.py walks only the rest).
    fresh: int = 0
    # What a fallback model cannot take of what the view does not show (exchange.NativeFit).
    _fit: NativeFit = AS_SENT
    # This turn, and how many of its input items the last view's repeat (for the recording).
    _prefix: NativePrefix = field(default_factory=lambda: NativePrefix("input"))
    # Compaction items the proxy minted: their view message (the summary, a user message once
    # the route has read it) -> the item's index. The latest is the history's new start.
    _minted: dict[int, int] = field(default_factory=dict)
    # Minted items among the items mapped here, (index, item, message), for the route to read.
    compactions: list[tuple[int, Item, Message]] = field(default_factory=list)
    _compaction_at: int = -1  # the index of the input's first compaction item (anyone's)
    # The app's learnt facts: which deployments were found to serve no /v1/responses.
    facts: DeploymentFacts = field(default_factory=DeploymentFacts, repr=False, compare=False)

    @classmethod
    def of(
        cls,
        body: dict[str, Any],
        previous: ResponsesMemory | None = None,
        facts: DeploymentFacts | None = None,
    ) -> ResponsesView:
        """The view of `body`; `previous`, the memory of the session's last turn, lends it the
        view messages of the input the two share; `facts`, the app's (a test's own if none)."""
        view = cls(body) if facts is None else cls(body, facts=facts)
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions:
            if previous is not None and instructions == previous.instructions:
                view._instructions = previous.instructions_message  # the same view message
            else:
                view._instructions = {"role": "system", "content": instructions}
            view.messages.append(view._instructions)  # type: ignore[arg-type]
        raw = body.get("input")
        view._items = (
            [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw or [])
        )
        view.fresh = view._reuse(previous) if previous is not None else 0
        view._map(view.fresh)
        view._built = list(view.messages)
        return view

    @classmethod
    def opening(cls, body: dict[str, Any]) -> list[Message]:
        """The instructions and the input up to its first user message, as the view has them:
        what names a session without an id (its beginning never changes)."""
        opening: list[Message] = []
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions:
            opening.append({"role": "system", "content": instructions})
        raw = body.get("input")
        if isinstance(raw, str):
            return [*opening, {"role": "user", "content": raw}]
        for item in raw or []:
            role = item.get("role") if isinstance(item, dict) else None
            if isinstance(role, str) and item.get("type", "message") == "message":
                opening.append({"role": role, "content": _content(item.get("content"))})
                if role == "user":
                    break
        return opening

    def _reuse(self, previous: ResponsesMemory) -> int:
        """Take the last turn's view messages for the input both turns share, up to the last
        message boundary in it; the index of the first item left to map."""
        shared = shared_prefix(self._items, previous.items)
        if shared:
            self._prefix = NativePrefix("input", self._prefix.turn, previous.turn, shared)
        if previous.repeated_ids:
            return 0
        k = bisect.bisect_right(previous.ends, shared, key=lambda end: end[0])
        if k == 0:
            return 0
        end, count = previous.ends[k - 1]
        before = 1 if previous.instructions_message is not None else 0
        lent = previous.built[before:count]
        self.messages += lent
        if count == len(previous.built):  # the usual turn: all of it (copies made in C)
            self._origins = dict(previous.origins)
            self._minted = dict(previous.minted)
        else:
            self._origins = {id(m): previous.origins[id(m)] for m in lent}
            minted = previous.minted
            self._minted = {id(m): minted[id(m)] for m in lent if id(m) in minted}
        if 0 <= previous.compaction_at < end:
            self._compaction_at = previous.compaction_at
        offset = len(self.messages) - count
        ends = previous.ends[:k]
        self._ends = ends if not offset else [(i, m + offset) for i, m in ends]
        if end == len(previous.items):
            self._calls, self._outputs = dict(previous.calls), dict(previous.outputs)
        else:
            self._calls = {c: i for c, i in previous.calls.items() if i < end}
            self._outputs = {c: i for c, i in previous.outputs.items() if i < end}
        return end

    def memory(self) -> ResponsesMemory:
        """What this turn leaves the session's next."""
        return ResponsesMemory(
            instructions=self.body.get("instructions"),
            instructions_message=self._instructions,
            items=self._items,
            built=self._built,
            ends=self._ends,
            origins=self._origins,
            minted=self._minted,
            calls=self._calls,
            outputs=self._outputs,
            repeated_ids=self._repeated_ids,
            compaction_at=self._compaction_at,
            turn=self._prefix.turn,
        )

    @property
    def client_manages_context(self) -> bool:
        """The request carries the client's own context management or compaction state: a
        `context_management` compaction entry, or a `compaction` item in its input (the
        proxy's own compaction should then yield to it, as its policy says)."""
        return self._compaction_at >= 0 or compact_threshold(self.body) is not None

    def history(self) -> list[Message]:
        """The view's messages from the history's start: with a compaction item the proxy
        minted, its summary, after the client's own messages before it (system, developer
        and user messages: what OpenAI's compacted window keeps) and before the rest; the
        turns it summarized are left out (archived under its ref)."""
        if not self._minted:
            return self.messages
        last = max((n for n, m in enumerate(self.messages) if id(m) in self._minted), default=None)
        if last is None:  # the stages replaced it: nothing marks a start any more
            return self.messages
        kept = [
            m
            for m in self.messages[:last]
            if m.get("role") in KEPT_ROLES and id(m) not in self._minted
        ]
        return [*kept, *self.messages[last:]]

    def chat_body(self) -> dict[str, Any]:
        chat: dict[str, Any] = {"model": self.body.get("model"), "messages": self.history()}
        tools = chat_tools(self.body.get("tools"), _chat_tool, self._tools)
        if tools:
            chat["tools"] = tools
        limit = self.body.get("max_output_tokens")
        if isinstance(limit, int):
            chat["max_tokens"] = limit
        choice = self.body.get("tool_choice")
        if isinstance(choice, str):
            chat["tool_choice"] = choice
        self._untouched = (chat["messages"], chat.get("tools"), chat.get("tool_choice"))
        return chat

    def native_for(self, deployment: Deployment) -> bool:
        return speaks_responses(deployment, self.facts)

    def translated(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The stages' output as a plain Chat Completions request, for a deployment that lacks
        Responses (what this loses: reasoning items and their encrypted content, tools other
        than functions, `include`, `store`, `previous_response_id`)."""
        out = dict(chat)
        out["messages"] = [_chat_message(m) for m in chat["messages"]]
        tools = [
            t for t in chat.get("tools") or [] if t.get("type") == "function" and "function" in t
        ]
        if tools:
            out["tools"] = tools
        else:
            out.pop("tools", None)
            out.pop("tool_choice", None)
        for name in ("temperature", "top_p"):
            if name in self.body:
                out[name] = self.body[name]
        limit, asked = self._fit.max_output_tokens, out.get("max_tokens")
        if limit is not None and isinstance(asked, int) and asked > limit:
            out["max_tokens"] = limit
        return out  # never streamed: a translated reply comes back whole (routes/responses.py)

    def reasoning(self) -> list[Item]:
        """The reasoning items of the input, as sent."""
        return [i for i in self._items if isinstance(i, dict) and i.get("type") == "reasoning"]

    def output_limit(self) -> int | None:
        limit = self.body.get("max_output_tokens")
        return limit if isinstance(limit, int) else None

    def fit(self, fit: NativeFit) -> None:
        self._fit = AS_SENT if fit == AS_SENT else fit  # as sent: the client's own body again

    def native_prefix(self) -> NativePrefix:
        return self._prefix

    def remember_turn(self, output: list[Item]) -> None:
        """A reply the proxy continues itself: its items go back whole (reasoning first)."""
        first = next((i.get("call_id") for i in output if i.get("type") in CALLS), None)
        if isinstance(first, str):
            self._turns[first] = [i for i in output if i.get("type") != "message"]

    def render(self, chat: dict[str, Any]) -> dict[str, Any]:
        untouched = (chat["messages"], chat.get("tools"), chat.get("tool_choice"))
        if untouched == self._untouched and not self._minted:
            if self._fit is AS_SENT:
                return self.body  # the common turn: nothing rewritten, the client's own body
            return _fitted(dict(self.body), self._fit)
        out = dict(self.body)
        messages: list[Message] = chat["messages"]
        if messages and messages[0] is self._instructions:
            messages = messages[1:]
        elif self._instructions is not None:
            if (
                messages
                and messages[0].get("role") == "system"
                and id(messages[0]) not in self._origins
            ):
                out["instructions"] = text_of_content(messages[0].get("content"))  # rewritten
                messages = messages[1:]
            else:
                out.pop("instructions", None)
        items = [item for message in messages for item in self._native(message)]
        items += [self._items[i] for i in self._tail]
        if isinstance(self.body.get("input"), str) and items == self._items:
            out["input"] = self.body["input"]
        else:
            out["input"] = items
        _render_tools(out, chat, self._tools)
        return out if self._fit is AS_SENT else _fitted(out, self._fit)

    # --- to the view --------------------------------------------------------------------------

    def _map(self, start: int) -> None:
        pending: list[int] = []  # items riding along with the next view message
        turn: Message | None = None
        for index in range(start, len(self._items)):
            item = self._items[index]
            if not isinstance(item, dict):
                pending.append(index)
                continue
            kind = item.get("type", "message")
            if kind in CALLS:
                call_id = item.get("call_id")
                if isinstance(call_id, str):
                    self._repeated_ids |= call_id in self._calls
                    self._calls[call_id] = index
                if turn is None:
                    turn = {"role": "assistant", "content": None, "tool_calls": []}
                    self._add(turn, pending)
                    pending = []
                turn["tool_calls"].append(_chat_call(item))
                self._origins[id(turn)].append(index)
                continue
            turn = None
            if kind in OUTPUTS:
                call_id = item.get("call_id")
                if isinstance(call_id, str):
                    self._repeated_ids |= call_id in self._outputs
                    self._outputs[call_id] = index
                result = {"role": "tool", "tool_call_id": call_id, "content": _output(item)}
                self._add(result, [*pending, index])
            elif kind == "message" and isinstance(item.get("role"), str):
                message = {"role": item["role"], "content": _content(item.get("content"))}
                self._add(message, [*pending, index])
            elif kind == "compaction" and is_minted(item):
                self._saw_compaction(index)
                summary: Message = {"role": "user", "content": ""}  # read by the route
                self._add(summary, [*pending, index])
                self._minted[id(summary)] = index
                self.compactions.append((index, item, summary))
            else:
                if kind == "compaction":
                    self._saw_compaction(index)
                if kind == "item_reference":
                    self.references.append(item.get("id"))
                pending.append(index)  # reasoning, web search, additional_tools, ...
                continue
            pending = []
            self._ends.append((index + 1, len(self.messages)))
        self._tail = pending

    def _saw_compaction(self, index: int) -> None:
        if self._compaction_at < 0:
            self._compaction_at = index

    def _add(self, message: Message, indexes: list[int]) -> None:
        self.messages.append(message)
        self._origins[id(message)] = list(indexes)

    # --- back to native -----------------------------------------------------------------------

    def _native(self, message: Message) -> Iterable[Item]:
        indexes = self._origins.get(id(message))
        if indexes is not None and id(message) in self._minted:  # no provider can read it
            text = text_of_content(message.get("content"))
            summary = {"role": "user", "content": [{"type": "input_text", "text": text}]}
            return [*(self._items[i] for i in indexes[:-1]), summary]
        if indexes is not None:
            return [self._items[i] for i in indexes]
        role = message.get("role")
        if role == "tool":
            return [self._output_item(message)]
        if role == "assistant" and message.get("tool_calls"):
            return self._turn(message)
        content = message.get("content")
        text = text_of_content(content)
        if role == "assistant":
            return [{"role": "assistant", "content": text}]
        role = "user" if role not in ("user", "developer") else role
        if isinstance(content, list):  # its parts kept (images, files, a marker in place)
            return [{"role": role, "content": _native_parts(content)}]
        return [{"role": role, "content": text}]

    def _output_item(self, message: Message) -> Item:
        call_id = message.get("tool_call_id")
        content = message.get("content")
        output = content if isinstance(content, str) else _native_parts(content)
        original = self._item(self._outputs, call_id)
        if original is not None:
            return {**original, "output": output}
        call = self._item(self._calls, call_id)
        kind = (
            "custom_tool_call_output"
            if call and call.get("type") == "custom_tool_call"
            else "function_call_output"
        )
        return {"type": kind, "call_id": call_id, "output": output}

    def _item(self, by_call: dict[str, int], call_id: Any) -> Item | None:
        index = by_call.get(call_id) if isinstance(call_id, str) else None
        return self._items[index] if index is not None else None

    def _turn(self, message: Message) -> list[Item]:
        """An assistant turn a stage rewrote (truncated arguments) or the proxy added (recall):
        the items it came from, each call with its arguments now."""
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        first = calls[0].get("id") if calls else None
        items: list[Item] = []
        kept = self._turns.get(first) if isinstance(first, str) else None
        if kept is None:  # the client's own turn: its items, in order
            kept = [self._items[self._calls[c["id"]]] for c in calls if c.get("id") in self._calls]
        by_id = {c.get("id"): c for c in calls}
        for item in kept:
            if item.get("type") not in CALLS:
                items.append(item)
            elif (call := by_id.pop(item.get("call_id"), None)) is not None:
                items.append(_with_arguments(item, call))
        items += [_new_call(call) for call in by_id.values()]
        return items


def _chat_message(message: Message) -> Message:
    """A view message as Chat Completions takes it: parts as text or image_url parts."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = [
        p
        if p.get("type") == "text"
        else {"type": "image_url", "image_url": {"url": p["image_url"]}}
        for p in content
        if p.get("type") == "text"
        or (p.get("type") == "input_image" and isinstance(p.get("image_url"), str))
    ]
    return {**message, "content": parts}


def _chat_call(item: Item) -> dict[str, Any]:
    arguments = item.get("arguments") if item.get("type") == "function_call" else item.get("input")
    return {
        "id": item.get("call_id"),
        "type": "function",
        "function": {
            "name": item.get("name"),
            "arguments": arguments if isinstance(arguments, str) else "",
        },
    }


def _with_arguments(item: Item, call: dict[str, Any]) -> Item:
    arguments = (call.get("function") or {}).get("arguments", "")
    key = "arguments" if item.get("type") == "function_call" else "input"
    return item if item.get(key) == arguments else {**item, key: arguments}


def _new_call(call: dict[str, Any]) -> Item:
    function = call.get("function") or {}
    return {
        "type": "function_call",
        "call_id": call.get("id"),
        "name": function.get("name"),
        "arguments": function.get("arguments") or "{}",
    }


def _output(item: Item) -> Any:
    output = item.get("output")
    if isinstance(output, list):
        return [_part(p) for p in output if isinstance(p, dict)]
    return output if isinstance(output, str) else ""


def _content(content: Any) -> Any:
    if isinstance(content, list):
        return [_part(p) for p in content if isinstance(p, dict)]
    return content


def _part(part: Item) -> Item:
    """A content part as a chat part: text parts read as text by the stages, the rest as is."""
    if part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    return part


def _native_parts(content: Any) -> list[Item]:
    if not isinstance(content, list):
        return []
    return [
        {"type": "input_text", "text": p["text"]} if p.get("type") == "text" else p
        for p in content
        if isinstance(p, dict)
    ]


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool in chat's shape (the stages read it); any other kind as it is."""
    if tool.get("type") != "function":
        return dict(tool)
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


def _render_tools(
    out: dict[str, Any], chat: dict[str, Any], natives: dict[int, dict[str, Any]]
) -> None:
    tools = chat.get("tools")
    if not tools:
        if out.pop("tools", None) is not None:  # taken away: so is any choice among them
            out.pop("tool_choice", None)
            out.pop("parallel_tool_calls", None)
        return
    native = []
    for tool in tools:
        if id(tool) in natives:
            native.append(natives[id(tool)])
        else:  # the proxy's own (recall), in Responses' flat form
            native.append({"type": "function", **tool.get("function", {})})
    out["tools"] = native
    if chat.get("tool_choice") == "none":
        out["tool_choice"] = "none"


def _fitted(out: dict[str, Any], fit: NativeFit) -> dict[str, Any]:
    """The rendered request without what a fallback model cannot take: reasoning items, the
    reasoning setting (and the include that asks for reasoning back), output beyond its limit."""
    items = out.get("input")
    if fit.drop_reasoning and isinstance(items, list):
        out["input"] = [
            i for i in items if not (isinstance(i, dict) and i.get("type") == "reasoning")
        ]
    if fit.drop_reasoning_setting:
        out.pop("reasoning", None)
        include = out.get("include")
        if isinstance(include, list) and ENCRYPTED_REASONING in include:
            out["include"] = [i for i in include if i != ENCRYPTED_REASONING]
    limit, asked = fit.max_output_tokens, out.get("max_output_tokens")
    if limit is not None and isinstance(asked, int) and asked > limit:
        out["max_output_tokens"] = limit
    return out
