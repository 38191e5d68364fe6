"""Loop detection: an agent re-issuing an identical call whose result will not change.

The agent re-sends its whole history every turn, so its recent tool calls are in the request.
Each call is hashed (tool name + canonical JSON of its arguments, key order ignored); the
session is **stuck** when the newest call occurred `repeats` times among the last `window`
calls, or when the newest calls are a short cycle (A→B→A→B, period 2 or 3) repeated at least
twice. Calls of tools in `allow` (polling) are left out first.

Each further detection in a session climbs the policy's ladder: `warn` appends a note for the
model, `no_tools` also sends `tool_choice: none` so the model must answer in words, `block`
refuses the request with a `loop_detected` error. A detection of another loop, or a step that is
no longer stuck, starts the ladder again. Re-sending the very same history (a client retry)
repeats the decision instead of climbing. Cheap: only the tail of the history is read, and call
hashes are cached; the calls of messages the session sent before (its stable prefix) are taken
from the session's last turn, not read again. The ladder's level lives in the state store
(shared by replicas); when it cannot be read the detection counts as the first.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import orjson
import xxhash
from cachetools import LRUCache

from proxy.errors import ProxyError
from proxy.exchange import Exchange
from proxy.messages import CUSTOM, Message
from proxy.pipeline.base import StageContext, forget_sessions, record, reusable
from proxy.pipeline.text_memo import TextMemo
from proxy.policies.spec import LoopAction, LoopSpec, Policy
from proxy.store import guard_record
from proxy.store.base import StoreError

REPEAT_NOTE = (
    "[agentproxy] You have called {name} with the same arguments {k} times in your last {n} "
    "calls ({args}); its result will not change. Try something different or explain what is "
    "blocking you."
)
CYCLE_NOTE = (
    "[agentproxy] You have repeated the same {p} calls in a cycle {k} times in your last {n} "
    "calls ({calls}); their results will not change. Try something different or explain what "
    "is blocking you."
)
NO_TOOLS_NOTE = " Tools are disabled for this reply: answer in words."
BLOCKED = (
    "loop detected: {what}; the result will not change. Detection {level} of this loop in this "
    "session (ladder: {ladder}), so the request was refused without calling the model. Make a "
    "different call, or tune the policy's loops settings (window, repeats, ladder, allow)."
)
ARGS_EXCERPT = 120  # characters of arguments quoted in notes and errors
PERIODS = (2, 3)  # cycle lengths looked for; a cycle must repeat twice to count
MESSAGES_PER_CALL = 3  # tail read per call wanted: the call, its result, maybe a user message


class LoopDetected(ProxyError):
    """A guard's refusal, not a failure. 429: the session has sent too many identical requests
    (the same family as budget_exceeded); `x-should-retry: false` stops the OpenAI SDKs from
    retrying a request that would be refused again."""

    status = 429
    type = "loop_detected"
    code = "loop_detected"

    def __init__(self, message: str, loop: dict[str, Any]) -> None:
        super().__init__(message, headers={"x-should-retry": "false"})
        self.loop = loop

    def body(self, request_id: str | None) -> dict[str, object]:
        body = super().body(request_id)
        error = body["error"]
        if isinstance(error, dict):
            error["loop"] = self.loop
        return body


class Call(NamedTuple):  # a tuple: one is built per recent call per turn
    name: str
    arguments: str  # as the model wrote them
    hash: int
    id: str | None
    message: int  # index of the assistant message that made it


@dataclass(frozen=True, slots=True)
class Loop:
    kind: Literal["repeat", "cycle"]
    hash: int  # of the repeated call, or of the cycle (the same whichever call it is at)
    calls: tuple[Call, ...]  # the repeated call, or one turn of the cycle in order
    count: int  # times the call (or the whole cycle) occurred
    looked_at: int  # recent calls counted among
    step: tuple[str | None, int]  # the newest call: a re-sent history has the same step

    @property
    def tool(self) -> str:
        return "→".join(call.name for call in self.calls)

    def describe(self) -> str:
        if self.kind == "repeat":
            call = self.calls[0]
            return (
                f"{call.name} was called with the same arguments {self.count} times in the "
                f"last {self.looked_at} calls ({_excerpt(call.arguments)})"
            )
        return (
            f"the same {len(self.calls)} calls were repeated in a cycle {self.count} times "
            f"in the last {self.looked_at} calls ({_cycle_text(self.calls)})"
        )

    def note(self) -> str:
        if self.kind == "repeat":
            call = self.calls[0]
            return REPEAT_NOTE.format(
                name=call.name, k=self.count, n=self.looked_at, args=_excerpt(call.arguments)
            )
        return CYCLE_NOTE.format(
            p=len(self.calls), k=self.count, n=self.looked_at, calls=_cycle_text(self.calls)
        )


PART = "loop"  # this guard's part of the session's guard record


@dataclass(frozen=True, slots=True)
class _Level:
    """Per session: the loop it is stuck in and how many steps it has been detected."""

    hash: int
    detections: int
    step: tuple[str | None, int]

    def to_json(self) -> list[Any]:
        return [self.hash, self.detections, *self.step]

    @classmethod
    def from_json(cls, value: Any) -> _Level | None:
        try:
            loop_hash, detections, call_id, message = value
        except (TypeError, ValueError):
            return None  # none kept (or another version's): as if this were the first
        return cls(loop_hash, detections, (call_id, message))


Read = dict[int, tuple["Call", ...]]  # calls by the index of the message that made them
CALL_BYTES = 120  # a Call's own size, besides its arguments' characters


class LoopStage:
    name = "loops"
    guard = True  # runs on every request, its history seen whole or not

    def __init__(self, memo_bytes: int = 4 * 1024 * 1024) -> None:
        # Per session, the calls read from its last turn's tail: (bytes held, calls by message,
        # the turn read).
        self._read: LRUCache[str, tuple[int, Read, object | None]] = LRUCache(
            memo_bytes, getsizeof=lambda entry: entry[0]
        )

    def memos(self) -> dict[str, LRUCache[Any, Any]]:
        return {"loop_calls": self._read}

    def forget(self, sessions: set[str]) -> None:
        forget_sessions(sessions, named=[self._read])

    def enabled(self, policy: Policy) -> bool:
        return policy.loops.enabled

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        spec = ex.policy.loops
        last = self._read.get(ex.identity.session)
        known = reusable(ex, messages, last[2]) if last is not None else 0
        read: Read = {}
        calls = recent_calls(messages, spec, read, last[1] if known and last else None, known)
        if messages is ex.messages:  # the client's list, index for index: reusable next turn
            self._remember(ex.identity.session, read, ex.rewrite.turn)
        if calls is None:
            return None  # no step of a loop just happened: nothing to judge, level kept
        loop = find_loop(calls, spec)
        prior = _Level.from_json((await guard_record.read(ctx.state, ex)).get(PART))
        if loop is None:
            if prior is not None:
                await _write(ctx, ex, None)
                record(ex, ctx, self.name, "recovered", level=prior.detections)
            return None
        level = _climb(prior, loop)
        await _write(ctx, ex, _Level(loop.hash, level, loop.step))
        action = spec.ladder[min(level, len(spec.ladder)) - 1]
        fields = {
            "tool": loop.tool,
            "kind": loop.kind,
            "repeats": loop.count,
            "window": loop.looked_at,
            "level": level,
            "hash": f"{loop.hash:016x}",
        }
        record(ex, ctx, self.name, action, **fields)
        return _apply(action, ex, messages, loop, fields)

    def _remember(self, session: str, read: Read, turn: object | None) -> None:
        size = 64 + sum(
            CALL_BYTES + len(call.arguments) for calls in read.values() for call in calls
        )
        if size <= self._read.maxsize:
            self._read[session] = (size, read, turn)


def _climb(prior: _Level | None, loop: Loop) -> int:
    """The session's detections of this loop, this one included."""
    if prior is None or prior.hash != loop.hash:
        return 1
    if prior.step == loop.step:
        return prior.detections  # the same history again (a retry): the same decision
    return prior.detections + 1


async def _write(ctx: StageContext, ex: Exchange, level: _Level | None) -> None:
    # A lost write is counted by the store; the next detection starts the ladder again.
    with contextlib.suppress(StoreError):
        await guard_record.write(ctx.state, ex, PART, level.to_json() if level else None)


def _apply(
    action: LoopAction, ex: Exchange, messages: list[Message], loop: Loop, fields: dict[str, Any]
) -> list[Message] | None:
    if action == "block":
        if ex.dry_run:
            return None
        ladder = " → ".join(ex.policy.loops.ladder)
        message = BLOCKED.format(what=loop.describe(), level=fields["level"], ladder=ladder)
        calls = [{"name": c.name, "arguments": _excerpt(c.arguments)} for c in loop.calls]
        raise LoopDetected(message, {**fields, "calls": calls})
    note = loop.note()
    if action == "no_tools":
        note += NO_TOOLS_NOTE
        if not ex.dry_run:
            _disable_tools(ex.body)
    return [*messages, {"role": "user", "content": note}]


def _disable_tools(body: dict[str, Any]) -> None:
    # OpenAI refuses tool_choice without tools, and without tools there is nothing to refuse.
    if body.get("tools"):
        body["tool_choice"] = "none"
    if body.get("functions"):  # the legacy spelling
        body["function_call"] = "none"


def recent_calls(
    messages: list[Message],
    spec: LoopSpec,
    read: Read | None = None,
    known: Read | None = None,
    known_until: int = 0,
) -> list[Call] | None:
    """The newest calls (oldest first, `allow`ed tools left out) read from the history's tail;
    None when the model's last message made no call, so no step of a loop just happened.
    `known`: calls read from the same messages before, by index, trusted below `known_until`;
    `read` collects the calls of every message looked at, for the next turn."""
    wanted = max(spec.window, 2 * PERIODS[-1])
    stop = max(0, len(messages) - wanted * MESSAGES_PER_CALL) - 1
    found: list[Call] = []
    stepped = False
    for index in range(len(messages) - 1, stop, -1):
        message = messages[index]
        if message.get("role") != "assistant":
            continue
        tool_calls = message.get("tool_calls")
        if not stepped:
            if not tool_calls:
                return None
            stepped = True
        if not isinstance(tool_calls, list):
            continue
        made = known.get(index) if known is not None and index < known_until else None
        if made is None:
            made = tuple(
                call for raw in reversed(tool_calls) if (call := _call(raw, index)) is not None
            )
        if read is not None:
            read[index] = made
        found.extend(call for call in made if call.name not in spec.allow)
        if len(found) >= wanted:
            break
    if not stepped:
        return None
    found.reverse()
    return found[-wanted:]


def find_loop(calls: list[Call], spec: LoopSpec) -> Loop | None:
    """A cycle at the tail first (its hash stays the same as it turns, where the newest call's
    would alternate), then the newest call repeated `repeats` times within `window`."""
    if not calls:
        return None
    hashes = [call.hash for call in calls]
    newest = calls[-1]
    step = (newest.id, newest.message)
    for period in PERIODS:
        covered = _cycle_length(hashes, period)
        if covered:
            turn = hashes[-period:]
            cycle = tuple(calls[-period:])
            return Loop("cycle", _cycle_hash(turn), cycle, covered // period, covered, step)
    recent = hashes[-spec.window :]
    count = recent.count(newest.hash)
    if count >= spec.repeats:
        return Loop("repeat", newest.hash, (newest,), count, len(recent), step)
    return None


def _call(raw: Any, index: int) -> Call | None:
    try:
        if raw.get("type") == CUSTOM:  # a custom tool's free text: hashed as written
            custom = raw[CUSTOM]
            name, text = custom["name"], custom.get("input")
            if type(name) is not str or type(text) is not str:
                return None
            return Call(name, text, _free_text_hash(name, text), raw.get("id"), index)
        function = raw["function"]
        name = function["name"]
        arguments = function.get("arguments")
    except (KeyError, TypeError, AttributeError):
        return None
    if type(name) is not str:
        return None
    if type(arguments) is not str:
        arguments = "" if arguments is None else orjson.dumps(arguments).decode()
    return Call(name, arguments, call_hash(name, arguments), raw.get("id"), index)


def _free_text_hash(name: str, text: str) -> int:
    """A custom call's identity: its name and input exactly (a patch or a script is not JSON
    whose key order could vary), apart from a function call's of the same name."""
    data = name.encode("utf-8", "surrogatepass") + b"\x01" + text.encode("utf-8", "surrogatepass")
    return xxhash.xxh3_64_intdigest(data)


def _call_hash(name: str, arguments: str) -> int:
    """Tool name + canonical JSON of the arguments (key order and spacing ignored); arguments
    that do not parse hash as written; empty arguments are `{}`, as frameworks read them."""
    if not arguments or arguments.isspace():
        canonical = b"{}"
    else:
        try:
            canonical = orjson.dumps(orjson.loads(arguments), option=orjson.OPT_SORT_KEYS)
        except (orjson.JSONDecodeError, orjson.JSONEncodeError):  # not JSON, or too deep
            canonical = arguments.encode("utf-8", "surrogatepass")
    return xxhash.xxh3_64_intdigest(name.encode("utf-8", "surrogatepass") + b"\x00" + canonical)


# The agent re-sends every old call each turn: a hit replaces a parse and a hash. Long
# arguments are hashed again.
call_hash = TextMemo(_call_hash)


def _cycle_length(hashes: list[int], period: int) -> int:
    """How many of the newest calls repeat with this period, when they make at least two
    turns of a cycle of different calls (A→A is a repeat, not a cycle); else 0."""
    turn = hashes[-period:]
    if len(hashes) < 2 * period or turn != hashes[-2 * period : -period] or len(set(turn)) == 1:
        return 0
    covered = 2 * period
    while covered < len(hashes) and hashes[-covered - 1] == hashes[-covered - 1 + period]:
        covered += 1
    return covered


def _cycle_hash(turn: list[int]) -> int:
    """The same for A→B and B→A… as the cycle turns: its smallest rotation, hashed."""
    first = min(turn[i:] + turn[:i] for i in range(len(turn)))
    return xxhash.xxh3_64_intdigest(b"".join(h.to_bytes(8, "little") for h in first))


def _cycle_text(calls: tuple[Call, ...]) -> str:
    return " → ".join(f"{call.name} {_excerpt(call.arguments)}" for call in calls)


def _excerpt(arguments: str) -> str:
    text = " ".join(arguments.split()) or "no arguments"
    return text if len(text) <= ARGS_EXCERPT else text[: ARGS_EXCERPT - 1] + "…"
