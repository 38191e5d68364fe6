"""What a rewrite stage is, and what it may use.

A stage never mutates the messages it is given: it returns a new list (reusing unchanged
message dicts) or None when it has nothing to do. The chain checks the result against the
provider's pairing rules and keeps the previous list if the stage broke them or crashed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Protocol

from cachetools import LRUCache

from proxy.exchange import Exchange, Usage
from proxy.messages import Message
from proxy.metrics import Metrics
from proxy.model_catalog import ModelCatalog
from proxy.pipeline.archive import Archive
from proxy.pipeline.meter import PromptMeter
from proxy.policies.spec import Policy
from proxy.recording.events import EventLog
from proxy.recording.recorder import Recorder
from proxy.store.base import Store
from proxy.store.state import MemoryState, StateStore

# Writes a summary of `messages` for the exchange's session, of at most the given number of
# tokens (its room in the window); raises on failure or timeout.
Summarizer = Callable[[Exchange, list[Message], int], Awaitable[str]]


class StageContext:
    """What the stages may use, passed in by whoever builds the pipeline."""

    __slots__ = (
        "archive", "catalog", "events", "meter", "metrics", "recorder", "state", "store",
        "summarize",
    )  # fmt: skip

    def __init__(
        self,
        store: Store,
        catalog: ModelCatalog,
        metrics: Metrics,
        events: EventLog,
        summarize: Summarizer,
        state: StateStore | None = None,
        recorder: Recorder | None = None,
        meter: PromptMeter | None = None,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.metrics = metrics
        self.events = events
        self.summarize = summarize
        self.state: StateStore = state or MemoryState()  # what guards keep between turns
        # The one seam to headers, metrics and the event log; shared with control when given.
        self.recorder = recorder or Recorder(metrics, events)
        # The one writer of what leaves a context (store before removal).
        self.archive = Archive(store, self.recorder)
        # The prompt's size as decisions take it: counted near them, calibrated.
        self.meter = meter or PromptMeter()


class Stage(Protocol):
    """A rewrite stage: one file, registered by one line in the rewriter's chain
    (proxy/pipeline/rewriter.py). `run` is its before-call hook; it implements whichever of
    the other named hooks (`Hooks`) it cares about, and the chain calls those in order.

    A stage may also set `preserves_pairing = True` when it only ever rewrites contents
    (keeping every role, tool_call_id and tool call id in place); the chain then skips the
    pairing check after it. Its tests must prove that. A `guard = True` stage runs even on an
    opaque history (one kept at the provider)."""

    name: str

    def enabled(self, policy: Policy) -> bool: ...

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None: ...


class Hooks(Protocol):
    """The optional hooks, by name; each runs only on the stages enabled for the policy.

    after_overflow  the provider said the context overflowed: the history to retry with
    accepted        the model took the request as sent
    after_call      the request is over: what it used (usage, cost, calls) is known
    memos           the stage's byte-bounded in-process memos, by name
    forget          drop what the stage remembers of these (idle) sessions
    """

    async def after_overflow(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None: ...

    def accepted(self, ex: Exchange) -> None: ...

    async def after_call(
        self, ex: Exchange, ctx: StageContext, usage: Usage | None, cost: float | None, calls: int
    ) -> None: ...

    def memos(self) -> dict[str, LRUCache[Any, Any]]: ...

    def forget(self, sessions: set[str]) -> None: ...


def reusable(ex: Exchange, messages: list[Message], basis: object | None) -> int:
    """How many leading messages of a stage's input it may take from what it memoised on the
    turn `basis` (the `ex.rewrite.turn` it stored then): the chain's stable prefix, when that
    turn is the one the chain compared this request with and no earlier stage changed the
    client's list; else 0. Two requests of a session may be in flight at once, one of them an
    edit: a memo from any other turn may describe a history this one does not extend."""
    if basis is not None and basis is ex.rewrite.stable_base and messages is ex.messages:
        return ex.rewrite.stable_prefix
    return 0


def forget_sessions(
    sessions: set[str],
    *,
    named: Iterable[MutableMapping[str, Any]] = (),
    led: Iterable[MutableMapping[Any, Any]] = (),
) -> None:
    """Drop the memo entries of `sessions`: `named` memos are keyed by the session, `led` ones
    by tuples that start with it (those are scanned: call it for many sessions at once)."""
    for memo in named:
        for session in sessions:
            memo.pop(session, None)
    for memo in led:
        for key in [key for key in memo if key[0] in sessions]:
            memo.pop(key, None)


def record(ex: Exchange, ctx: StageContext, stage: str, action: str, **fields: Any) -> None:
    """Make a rewrite visible: a note for the headers, a metric, and an event log line."""
    ctx.recorder.record(ex, stage, action, **fields)
