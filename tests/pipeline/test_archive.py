"""The one archive writer: store before removal, for every kind of content that leaves a
context, with one failure policy (a failed write removes nothing, and says so)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest

from proxy.exchange import Exchange
from proxy.messages import Message, pairing_problems
from proxy.pipeline.archive import Archive, entry
from proxy.pipeline.base import StageContext
from proxy.pipeline.compaction import CompactionStage
from proxy.pipeline.offload import OffloadStage
from proxy.pipeline.repair import RepairStage
from proxy.policies.spec import OffloadSpec, Policy
from proxy.store.base import BlobInfo, StoreError, content_ref
from proxy.store.memory import MemoryStore
from tests.pipeline import factories
from tests.pipeline.compaction.factories import (
    Scripted,
    call,
    coding_session,
    exchange,
    result,
    user,
)
from tests.pipeline.compaction.factories import context as compaction_context

DISK_FULL = "local store /x/store.sqlite3: put failed: database or disk is full"


class FailingStore(MemoryStore):
    """Takes no writes at all, or none whose bytes contain `refuse`."""

    def __init__(self, refuse: bytes = b"") -> None:
        super().__init__()
        self.refuse = refuse

    async def put(self, info: BlobInfo, data: bytes) -> None:
        if self.refuse in data:
            raise StoreError(DISK_FULL)
        await super().put(info, data)


def failures(ex: Exchange, stage: str) -> list[dict[str, Any]]:
    return [n.fields for n in ex.notes if (n.stage, n.action) == (stage, "store_failed")]


def counted(ctx: StageContext, stage: str) -> float:
    labels = {"stage": stage, "action": "store_failed"}
    return ctx.metrics.registry.get_sample_value("agentproxy_rewrites_total", labels) or 0.0


# --- the writer itself --------------------------------------------------------------------


async def test_refs_are_content_addressed_in_the_scoped_session_and_owned() -> None:
    ctx = factories.context()
    ex = factories.exchange([], session="key:alice/s1")
    ex.identity.owner = "key:alice"
    one = entry(ex, "tool_result", b"payload", tool="read_file")
    again = entry(ex, "tool_result", b"payload", tool="read_file")
    assert one.ref == again.ref == content_ref("key:alice/s1", "tool_result", b"payload")
    assert await ctx.archive.keep(ex, "offload", [one, again]) == {one.ref}
    stored = await ctx.store.get(one.ref)
    assert stored is not None and stored[1] == b"payload"
    info = stored[0]
    assert (info.session, info.owner, info.kind) == ("key:alice/s1", "key:alice", "tool_result")
    assert info.meta == {"tool": "read_file"} and info.size == len(b"payload")
    assert ex.notes == []  # a successful write is the stage's to report


async def test_a_failed_batch_is_recorded_once_with_the_store_error() -> None:
    ctx = factories.context(FailingStore())
    ex = factories.exchange([])
    entries = [entry(ex, "tool_result", b"a"), entry(ex, "tool_result", b"b")]
    assert await Archive(ctx.store, ctx.recorder).keep(ex, "offload", entries) == set()
    assert failures(ex, "offload") == [{"count": 2, "error": f"StoreError: {DISK_FULL}"}]
    assert counted(ctx, "offload") == 1


async def test_only_the_writes_that_failed_keep_their_content() -> None:
    ctx = factories.context(FailingStore(refuse=b"secret"))
    ex = factories.exchange([])
    kept, lost = entry(ex, "history", b"fine"), entry(ex, "history", b"secret plans")
    assert await ctx.archive.keep(ex, "compaction", [kept, lost]) == {kept.ref}
    assert failures(ex, "compaction")[0]["count"] == 1


# --- every kind, through the stage that removes it ----------------------------------------

BIG = "".join(f"row {n}: value {n * 7}\n" for n in range(200))  # ~4,000 chars
Case = Callable[[MemoryStore], Awaitable[tuple[list[Message], list[Message] | None, Exchange]]]


async def tool_result(store: MemoryStore) -> tuple[list[Message], list[Message] | None, Exchange]:
    policy = Policy(name="t", offload=OffloadSpec(min_tokens=100))
    history = [user("read it"), call("c1", "read_file", path="a"), result("c1", BIG)]
    ex = factories.exchange(history, policy)
    return history, await OffloadStage().run(ex, history, factories.context(store)), ex


async def set_aside(store: MemoryStore) -> tuple[list[Message], list[Message] | None, Exchange]:
    # An orphan (no call asked for it) and a second answer to an answered call.
    history = [
        user("go"),
        result("z", BIG),
        call("a", "read_file", path="a"),
        result("a", "first"),
        result("a", "second " + BIG),
        user("and then?"),
    ]
    ex = factories.exchange(history)
    return history, await RepairStage().run(ex, history, factories.context(store)), ex


async def tool_arguments(
    store: MemoryStore,
) -> tuple[list[Message], list[Message] | None, Exchange]:
    history = coding_session(8)  # long write_file bodies, over the 2,000-token window
    ex = exchange(history)
    out = await CompactionStage().run(ex, history, compaction_context(Scripted(), store))
    return history, out, ex


async def history(store: MemoryStore) -> tuple[list[Message], list[Message] | None, Exchange]:
    messages = coding_session(20, content_chars=280)  # nothing to truncate: summarized
    ex = exchange(messages)
    out = await CompactionStage().run(ex, messages, compaction_context(Scripted(), store))
    return messages, out, ex


@pytest.mark.parametrize("case", [tool_result, set_aside, tool_arguments, history])
async def test_a_store_that_fails_writes_leaves_the_content_in_place(case: Case) -> None:
    messages, out, ex = await case(FailingStore())
    present = "\n".join(text for message in out or messages for text in _texts(message))
    for message in messages:  # every text the client sent still reaches the model, whole
        for text in _texts(message):
            assert text in present, text[:60]
    assert pairing_problems(out or messages) == []
    failed = [n.fields for n in ex.notes if n.action == "store_failed"]
    assert failed and all(f["error"] == f"StoreError: {DISK_FULL}" for f in failed)
    assert not any(n.action in ("offloaded", "archived", "summarized") for n in ex.notes)

    # With a working store the same case does remove something: the test is not vacuous.
    _, out, ex = await case(MemoryStore())
    assert out is not None and len(orjson.dumps(out)) < len(orjson.dumps(messages))
    assert not any(n.action == "store_failed" for n in ex.notes)


def _texts(message: Message) -> list[str]:
    """Its content and its calls' string arguments: what a stage could move out."""
    texts = [message["content"]] if isinstance(message.get("content"), str) else []
    for tool_call in message.get("tool_calls") or ():
        arguments = orjson.loads(tool_call["function"]["arguments"]).values()
        texts.extend(value for value in arguments if isinstance(value, str))
    return texts
