"""A Gemini `generateContent` request as the rewrite stages see it, and back.

The stages work on chat-shaped messages. A Gemini history maps onto that shape content by
content: the system instruction becomes a leading system message; a user content's
`functionResponse` parts become `tool` messages and its other parts one user message after
them (text as text, `inlineData` images as image parts); a model content's text becomes its
content and its `functionCall` parts its `tool_calls`. Thought parts are reasoning: not in the
view, but kept with their turn.

Function calls carry no id on Google AI Studio: the view names each call by its place
(`gemini-<content>-<part>`, stable as the history grows) unless it has an id, and pairs each
`functionResponse` with its call by id, else by name, else by order.

Going back is lossless for everything the stages left alone: a view message that is still the
object built here goes back as the client's own content, parts and `thoughtSignature`s byte for
byte. Only what a stage changed or added is built anew, each untouched part of its content kept.

Incremental: the memory of a session's previous turn (memory.py) lends this one its view
messages for the leading contents both turns share (one `==` each); only the rest is mapped.
View messages name their contents by position, so what goes back upstream is always this turn's
own contents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.exchange import NativeFit, NativePrefix
from proxy.messages import Message
from proxy.pipeline.repair import is_synthetic
from proxy.policies.spec import Deployment
from proxy.wire.gemini.memory import GeminiMemory
from proxy.wire.gemini.memory import Origin as _Origin
from proxy.wire.gemini.request import field as read
from proxy.wire.gemini.request import field_name
from proxy.wire.gemini.upstream import speaks_gemini
from proxy.wire.translate import chat_tools, shared_prefix, text_of_content

Part = dict[str, Any]
Content = dict[str, Any]
AS_SENT = NativeFit()
CALL_PREFIX = "gemini-"  # the view's ids of calls that came without one


@dataclass(slots=True)
class GeminiView:
    body: dict[str, Any]  # the client's request (with `model` from the path), never mutated
    messages: list[Message] = field(default_factory=list)
    _origins: dict[int, _Origin] = field(default_factory=dict)  # by id() of a view message
    # Every call the view knows, by its view id: (its name, its own id if it came with one).
    _calls: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    # Replies the proxy continued itself (recall rounds), by their first call's view id: the
    # turn goes back with all of its parts (thoughts and signatures included).
    _turns: dict[str, list[tuple[Part, str | None]]] = field(default_factory=dict)
    # The client's function declarations by id() of their chat twins.
    _tools: dict[int, dict[str, Any]] = field(default_factory=dict)
    _untouched: tuple[Any, Any, Any] = (None, None, None)
    _fit: NativeFit = AS_SENT
    # This turn, and how many of its contents the last view's repeat (for the recording).
    _prefix: NativePrefix = field(default_factory=lambda: NativePrefix("contents"))
    # The view as built, before any stage saw it: _ends[i] is its length after content i.
    _built: list[Message] = field(default_factory=list)
    _ends: list[int] = field(default_factory=list)
    # The first content mapped here: those before it were lent by the session's last view,
    # whose turn checked them.
    fresh: int = 0

    @classmethod
    def of(cls, body: dict[str, Any], previous: GeminiMemory | None = None) -> GeminiView:
        """The view of `body`; `previous`, the memory of the session's last turn, lends it the
        view messages of the contents the two share."""
        view = cls(body)
        system = read(body, "systemInstruction")
        if previous is not None and system and system == previous.system:
            view._add(previous.built[0], -1, ())  # the same instruction: the same view message
        elif system:
            view._add({"role": "system", "content": _text_of(system)}, -1, ())
        contents = body["contents"]
        view.fresh = view._reuse(previous) if previous is not None else 0
        for index in range(view.fresh, len(contents)):
            view._map(index, contents[index])
            view._ends.append(len(view.messages))
        view._built = list(view.messages)
        return view

    def _reuse(self, previous: GeminiMemory) -> int:
        """Take the last turn's view messages (and the calls they name) for the leading
        contents both turns share; how many those are."""
        shared = shared_prefix(self.body["contents"], previous.contents)
        if not shared:
            return 0
        self._prefix = NativePrefix("contents", self._prefix.turn, previous.turn, shared)
        built = previous.built
        before = 1 if built and previous.origins[id(built[0])].index < 0 else 0
        lent = built[before : previous.ends[shared - 1]]
        same_system = len(self.messages) == before and (not before or self.messages[0] is built[0])
        if same_system and len(lent) == len(built) - before:  # copies made in C
            self._origins.update(previous.origins)
            self._calls = dict(previous.calls)
        else:
            self._origins.update((id(m), previous.origins[id(m)]) for m in lent)
            for message in lent:
                for call in message.get("tool_calls") or ():
                    self._calls[call["id"]] = previous.calls[call["id"]]
        offset = len(self.messages) - before  # an instruction gained or lost shifts the ends
        self.messages += lent
        ends = previous.ends[:shared]
        self._ends = ends if not offset else [end + offset for end in ends]
        return shared

    def memory(self) -> GeminiMemory:
        """What this turn leaves the session's next."""
        return GeminiMemory(
            system=read(self.body, "systemInstruction"),
            contents=self.body["contents"],
            built=self._built,
            ends=self._ends,
            origins=self._origins,
            calls=self._calls,
            turn=self._prefix.turn,
        )

    @classmethod
    def opening(cls, body: dict[str, Any]) -> list[Message]:
        """The system instruction and the history up to its first user message: what names a
        session without an id (its beginning never changes)."""
        view = cls(body)
        system = read(body, "systemInstruction")
        if system:
            view._add({"role": "system", "content": _text_of(system)}, -1, ())
        for index, content in enumerate(body["contents"]):
            view._map(index, content)
            if view.messages and view.messages[-1].get("role") == "user":
                break
        return view.messages

    # --- the chat-shaped request --------------------------------------------------------------

    def chat_body(self) -> dict[str, Any]:
        chat: dict[str, Any] = {"model": self.body["model"], "messages": self.messages}
        declarations = [
            declaration
            for tool in self.body.get("tools") or []
            for declaration in read(tool, "functionDeclarations") or []
        ]
        tools = chat_tools(declarations, _chat_tool, self._tools)
        if tools:
            chat["tools"] = tools
        choice = _chat_tool_choice(read(self.body, "toolConfig"))
        if choice is not None:
            chat["tool_choice"] = choice
        self._untouched = (self.messages, chat.get("tools"), chat.get("tool_choice"))
        return chat

    @staticmethod
    def native_for(deployment: Deployment) -> bool:
        return speaks_gemini(deployment)

    def translated(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The stages' output as a Chat Completions request (what this loses: thought parts
        and their signatures, safety settings, Google's built-in tools)."""
        out = dict(chat)
        config = read(self.body, "generationConfig") or {}
        for name, chat_name in (
            ("maxOutputTokens", "max_tokens"),
            ("temperature", "temperature"),
            ("topP", "top_p"),
            ("stopSequences", "stop"),
        ):
            value = read(config, name)
            if value is not None:
                out[chat_name] = value
        limit = self._fit.max_output_tokens
        if limit is not None and isinstance(out.get("max_tokens"), int):
            out["max_tokens"] = min(out["max_tokens"], limit)
        return out

    def reasoning(self) -> list[Part]:
        """The thought parts (and signed parts) of the client's model turns, as sent."""
        return [
            part
            for content in self.body["contents"]
            if content.get("role") == "model"
            for part in content["parts"]
            if part.get("thought") is True or read(part, "thoughtSignature") is not None
        ]

    def output_limit(self) -> int | None:
        limit = read(read(self.body, "generationConfig"), "maxOutputTokens")
        return limit if isinstance(limit, int) else None

    def fit(self, fit: NativeFit) -> None:
        self._fit = AS_SENT if fit == AS_SENT else fit

    def native_prefix(self) -> NativePrefix:
        return self._prefix

    def remember_turn(self, parts: list[Part], prefix: str) -> Message:
        """A reply the proxy may continue itself (a recall round): its chat message, and its
        parts kept to go back as they came."""
        named = [(part, self._call_of(part, prefix, k)) for k, part in enumerate(parts)]
        first = next((name for _, name in named if name is not None), None)
        if first is not None:
            self._turns[first] = named
        return _assistant([p for p, _ in named], [n for _, n in named])

    def render(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The native request for `chat` (the stages' output): the client's body with its
        system instruction, contents, tools and tool config as the stages left them."""
        if (chat["messages"], chat.get("tools"), chat.get("tool_choice")) == self._untouched:
            return self._fitted(_native_body(self.body))
        out = _native_body(self.body)
        messages: list[Message] = chat["messages"]
        start = 0
        system_key = field_name(out, "systemInstruction")
        if messages and messages[0].get("role") == "system":
            origin = self._origins.get(id(messages[0]))
            if origin is None or origin.index != -1:
                out[system_key] = {"parts": [{"text": text_of_content(messages[0]["content"])}]}
            start = 1
        else:
            out.pop(system_key, None)
        out[field_name(out, "contents")] = self._contents(messages[start:])
        self._render_tools(out, chat)
        return self._fitted(out)

    # --- to the view --------------------------------------------------------------------------

    def _add(self, message: Message, index: int, parts: tuple[int, ...]) -> None:
        self.messages.append(message)
        self._origins[id(message)] = _Origin(index, parts)

    def _call_of(self, part: Part, prefix: str, k: int) -> str | None:
        """The view id of a functionCall part (registered), None for any other part."""
        call = read(part, "functionCall")
        if not isinstance(call, dict):
            return None
        own = call.get("id")
        name = own if isinstance(own, str) and own else f"{CALL_PREFIX}{prefix}-{k}"
        self._calls[name] = (str(call.get("name")), own if isinstance(own, str) else None)
        return name

    def _map(self, index: int, content: Content) -> None:
        parts: list[Part] = content["parts"]
        if content.get("role") == "model":
            names = [self._call_of(p, str(index), k) for k, p in enumerate(parts)]
            self._add(_assistant(parts, names), index, tuple(range(len(parts))))
            return
        rest: list[int] = []
        calls = self._open_calls()
        for k, part in enumerate(parts):
            response = read(part, "functionResponse")
            if not isinstance(response, dict):
                rest.append(k)
                continue
            call_id = _pair(response, calls) or f"{CALL_PREFIX}orphan-{index}-{k}"
            result = {"role": "tool", "tool_call_id": call_id, "content": _result_text(response)}
            self._add(result, index, (k,))
        if rest:
            chat_parts = [_chat_part(parts[k]) for k in rest]
            self._add({"role": "user", "content": chat_parts}, index, tuple(rest))

    def _open_calls(self) -> list[tuple[str, str, str | None]]:
        """The calls of the last model turn so far: (view id, name, own id)."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                ids = [c["id"] for c in message.get("tool_calls") or ()]
                return [(i, *self._calls[i]) for i in ids]
            if message.get("role") == "user":
                return []
        return []

    # --- back to native -----------------------------------------------------------------------

    def _contents(self, view: list[Message]) -> list[Content]:
        """Each view message as a content; the pieces of one client content (its results and
        its other parts), and whatever the stages built beside them, joined again."""
        client = self.body["contents"]
        out: list[tuple[Content, int | None, list[int]]] = []  # (content, source, its parts)
        for message in view:
            origin = self._origins.get(id(message))
            source: int | None = None
            taken: list[int] = []
            if origin is not None and origin.index >= 0:
                source, taken = origin.index, list(origin.parts)
                original = client[source]
                content: Content = {**original, "parts": [original["parts"][k] for k in taken]}
            elif message.get("role") == "assistant":
                content = {"role": "model", "parts": self._model_parts(message)}
            elif message.get("role") == "tool":
                content = {"role": "user", "parts": [self._response_part(message)]}
            else:
                content = {"role": "user", "parts": _native_parts(message.get("content"))}
            if not content["parts"]:
                continue
            if out and _joins(out[-1], content, source):
                last, last_source, last_taken = out[-1]
                joined = {**last, "parts": [*last["parts"], *content["parts"]]}
                out[-1] = (joined, last_source if last_source == source else None, [])
                if last_source is not None and last_source == source:
                    out[-1] = (joined, source, last_taken + taken)
                continue
            out.append((content, source, taken))
        return [self._whole(c, s, t) for c, s, t in out]

    def _whole(self, content: Content, source: int | None, taken: list[int]) -> Content:
        """A client content all of whose parts came back in order: the client's own object."""
        if source is not None:
            original: Content = self.body["contents"][source]
            if taken == list(range(len(original["parts"]))):
                return original
        return content

    def _model_parts(self, message: Message) -> list[Part]:
        """A model turn a stage rewrote (truncated arguments) or the proxy added (a recall
        round): its parts as they came, each call with its arguments as the stages left them."""
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        first = calls[0].get("id") if calls else None
        named = self._turns.get(first) if isinstance(first, str) else None
        if named is None:
            parts: list[Part] = []
            if message.get("content"):
                parts.append({"text": text_of_content(message["content"])})
            for call in calls:
                function = call.get("function") or {}
                name, own = self._calls.get(str(call.get("id")), (function.get("name"), None))
                native: dict[str, Any] = {"name": name, "args": _arguments(function)}
                if own is not None:
                    native["id"] = own
                parts.append({"functionCall": native})
            return parts
        by_id = {c.get("id"): c for c in calls}
        out: list[Part] = []
        for part, name in named:
            if name is None:
                out.append(part)
            elif (chosen := by_id.get(name)) is not None:
                key = field_name(part, "functionCall")
                args = _arguments(chosen.get("function") or {})
                out.append({**part, key: {**part[key], "args": args}})
        return out

    def _response_part(self, message: Message) -> Part:
        """A function response a stage rewrote (offloaded: the client's part with its new
        output) or made (repair's stand-in for a missing result; a recall answer)."""
        call_id = str(message.get("tool_call_id"))
        text = text_of_content(message.get("content"))
        name, own = self._calls.get(call_id, ("unknown", None))
        if is_synthetic(message):
            response: dict[str, Any] = {"error": text}
        else:
            parsed = _json_object(text)
            response = parsed if parsed is not None else {"output": text}
        native: dict[str, Any] = {"name": name, "response": response}
        if own is not None:
            native["id"] = own
        return {"functionResponse": native}

    def _render_tools(self, out: dict[str, Any], chat: dict[str, Any]) -> None:
        """Tools as the stages left them: the client's declarations as sent (and its other
        tools: search, code execution), the proxy's recall tool added, none when a guard took
        tool use away."""
        kept = {id(self._tools[id(t)]) for t in chat.get("tools") or () if id(t) in self._tools}
        added = [_declaration(t) for t in chat.get("tools") or () if id(t) not in self._tools]
        tools: list[dict[str, Any]] = []
        for tool in self.body.get("tools") or []:
            declarations = read(tool, "functionDeclarations")
            if declarations is None:
                tools.append(tool)
                continue
            left = [d for d in declarations if id(d) in kept]
            if left:
                key = field_name(tool, "functionDeclarations")
                tools.append(tool if len(left) == len(declarations) else {**tool, key: left})
        if added:
            tools.append({"functionDeclarations": added})
        if tools:
            out["tools"] = tools
        else:
            out.pop("tools", None)
            out.pop(field_name(out, "toolConfig"), None)
        if chat.get("tool_choice") == "none" and tools:
            out[field_name(out, "toolConfig")] = {"functionCallingConfig": {"mode": "NONE"}}

    def _fitted(self, out: dict[str, Any]) -> dict[str, Any]:
        """The request without what a fallback model cannot take: thought parts and
        signatures, the thinking setting, output beyond its limit."""
        fit = self._fit
        if fit is AS_SENT:
            return out
        key = field_name(out, "contents")
        if fit.drop_reasoning:
            contents = (_without_thoughts(c) for c in out[key])
            out[key] = [c for c in contents if c is not None]
        config_key = field_name(out, "generationConfig")
        config = out.get(config_key)
        if isinstance(config, dict):
            config = dict(config)
            if fit.drop_reasoning or fit.drop_reasoning_setting:
                config.pop(field_name(config, "thinkingConfig"), None)
            limit_key = field_name(config, "maxOutputTokens")
            limit = config.get(limit_key)
            if fit.max_output_tokens is not None and isinstance(limit, int):
                config[limit_key] = min(limit, fit.max_output_tokens)
            out[config_key] = config
        return out


def _native_body(body: dict[str, Any]) -> dict[str, Any]:
    """The client's body as Google reads it: without the model the proxy added."""
    out = dict(body)
    del out["model"]
    return out


def _joins(
    last: tuple[Content, int | None, list[int]], content: Content, source: int | None
) -> bool:
    """Whether `content` goes into the content before it: pieces of one client content, or
    something the stages built beside one of the same role (results beside results)."""
    before, before_source, _ = last
    if before.get("role", "user") != content.get("role", "user"):
        return False
    return source is None or before_source is None or before_source == source


def _pair(response: dict[str, Any], calls: list[tuple[str, str, str | None]]) -> str | None:
    """The view id of the call a functionResponse answers (taken from `calls`): by id, else
    the first of that name, else the first."""
    own = response.get("id")
    name = response.get("name")
    for test in (
        lambda c: isinstance(own, str) and (c[0] == own or c[2] == own),
        lambda c: c[1] == name,
        lambda c: True,
    ):
        for at, call in enumerate(calls):
            if test(call):
                del calls[at]
                return call[0]
    return None


def _assistant(parts: list[Part], names: list[str | None]) -> Message:
    """A model turn's parts as a chat message: its text (thoughts aside), its calls."""
    texts = [
        p["text"] for p in parts if isinstance(p.get("text"), str) and p.get("thought") is not True
    ]
    calls = []
    for part, name in zip(parts, names, strict=True):
        if name is None:
            continue
        call = read(part, "functionCall")
        calls.append(
            {
                "id": name,
                "type": "function",
                "function": {
                    "name": call.get("name"),
                    "arguments": orjson.dumps(call.get("args") or {}).decode(),
                },
            }
        )
    message: Message = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _result_text(response: dict[str, Any]) -> str:
    """A function's response as the text the stages read: its `output` when that is all it
    holds (the Gemini CLI's shape), else its JSON."""
    value = response.get("response")
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("output"), str):
        return str(value["output"])
    return orjson.dumps(value if value is not None else {}).decode()


def _json_object(text: str) -> dict[str, Any] | None:
    if not text.startswith("{"):
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _chat_part(part: Part) -> Part:
    """A user part as a chat part: text stays text (the stages read it); an inline image is
    an image part; anything else goes as it is (a translation sends what chat takes)."""
    if isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    data = read(part, "inlineData")
    if isinstance(data, dict):
        mime = str(read(data, "mimeType") or "application/octet-stream")
        url = f"data:{mime};base64,{data.get('data', '')}"
        if mime.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": url}}
        return {"type": "file", "file": {"file_data": url}}
    return part


def _native_parts(content: Any) -> list[Part]:
    """A chat content the stages built, as parts."""
    if isinstance(content, str):
        return [{"text": content}] if content else []
    parts: list[Part] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            parts.append({"text": str(part.get("text", ""))})
        elif part.get("type") == "image_url":
            url = str((part.get("image_url") or {}).get("url", ""))
            head, _, data = url.partition(",")
            mime = head.removeprefix("data:").removesuffix(";base64")
            parts.append({"inlineData": {"mimeType": mime, "data": data}})
        elif "type" not in part:
            parts.append(part)  # a client's part the view passed as it was
    return parts


def _text_of(system: Any) -> str:
    if isinstance(system, str):
        return system
    parts = system.get("parts") if isinstance(system, dict) else None
    return "\n".join(
        p["text"] for p in parts or () if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


def _arguments(function: dict[str, Any]) -> dict[str, Any]:
    try:
        value = orjson.loads(function.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        return {"arguments": function.get("arguments")}  # a rewrite left no JSON: its text
    return value if isinstance(value, dict) else {"arguments": value}


def _chat_tool(declaration: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": declaration.get("name")}
    if "description" in declaration:
        function["description"] = declaration["description"]
    parameters = read(declaration, "parametersJsonSchema") or declaration.get("parameters")
    if parameters is not None:
        function["parameters"] = _lower_types(parameters)
    return {"type": "function", "function": function}


def _lower_types(schema: Any) -> Any:
    """Google's OpenAPI schema as JSON Schema: its types are upper case (OBJECT, STRING)."""
    if isinstance(schema, dict):
        out = {k: _lower_types(v) for k, v in schema.items()}
        if isinstance(out.get("type"), str):
            out["type"] = out["type"].lower()
        return out
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema


def _declaration(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool the proxy added (its recall tool), as a function declaration."""
    function = tool.get("function") or {}
    return {
        "name": function.get("name"),
        "description": function.get("description", ""),
        "parametersJsonSchema": function.get("parameters") or {"type": "object"},
    }


def _chat_tool_choice(config: Any) -> Any:
    calling = read(config, "functionCallingConfig")
    mode = str(calling.get("mode", "")).upper() if isinstance(calling, dict) else ""
    if mode == "ANY":
        allowed = read(calling, "allowedFunctionNames")
        if isinstance(allowed, list) and len(allowed) == 1:
            return {"type": "function", "function": {"name": allowed[0]}}
        return "required"
    return {"NONE": "none", "AUTO": "auto"}.get(mode)


def _without_thoughts(content: Content) -> Content | None:
    if content.get("role") != "model":
        return content
    parts = [
        {k: v for k, v in p.items() if k not in ("thoughtSignature", "thought_signature")}
        for p in content["parts"]
        if p.get("thought") is not True
    ]
    return {**content, "parts": parts} if parts else None
