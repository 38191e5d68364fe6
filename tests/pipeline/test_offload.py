"""Offload: large tool results go to the store first, then become a stable pointer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.messages import Message, is_valid_pairing
from proxy.pipeline import offload
from proxy.pipeline.offload import OffloadStage, pointer_text
from proxy.policies.spec import ApiKey, OffloadSpec, Policy, RecallSpec
from proxy.store.base import BlobInfo, StoreError, content_ref
from proxy.store.local import LocalStore
from proxy.store.memory import MemoryStore
from tests.pipeline.factories import context, deployment, exchange

SMALL = OffloadSpec(min_tokens=100, preview_lines=2, line_chars=40)  # offload above ~400 chars
POLICY = Policy(name="test", offload=SMALL)


def numbered(lines: int, width: int = 30) -> str:
    return "\n".join(f"line {i:04d} " + "x" * width for i in range(1, lines + 1)) + "\n"


def history(result: Any, call_id: str = "call_1", tool: str = "read_file") -> list[Message]:
    call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": "{}"}}
    return [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": "done"},
    ]


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.puts = 0

    async def put(self, info: BlobInfo, data: bytes) -> None:
        self.puts += 1
        await super().put(info, data)


class BrokenStore(MemoryStore):
    async def put(self, info: BlobInfo, data: bytes) -> None:
        raise StoreError("local store /x/store.sqlite3: put failed: database or disk is full")


def rewrites(ctx: Any, action: str) -> float:
    labels = {"stage": "offload", "action": action}
    return ctx.metrics.registry.get_sample_value("agentproxy_rewrites_total", labels) or 0.0


async def test_small_results_are_skipped_without_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_hashing(*args: Any) -> str:
        raise AssertionError("a small message must not be hashed")

    monkeypatch.setattr(offload, "ref_of", no_hashing)
    messages = history("short result " * 20)  # ~280 chars: under min_tokens * 3
    assert await OffloadStage().run(exchange(messages, POLICY), messages, context()) is None


async def test_results_between_prefilter_and_threshold_stay() -> None:
    messages = history("y" * 380)  # past the 300-char pre-check, ~99 tokens: still under 100
    assert await OffloadStage().run(exchange(messages, POLICY), messages, context()) is None


@pytest.mark.parametrize(("window", "offloaded"), [(8192, True), (200_000, False)])
async def test_a_small_window_lowers_the_threshold(window: int, offloaded: bool) -> None:
    # ~3,000 tokens: under the default min_tokens (20,000), but over a quarter of an 8k window.
    messages = history("z" * 12_000)
    ex = exchange(messages, Policy(name="default"))
    ex.deployment = deployment(window)
    out = await OffloadStage().run(ex, messages, context())
    assert (out is not None) is offloaded


async def test_large_result_is_stored_then_replaced_by_a_pointer() -> None:
    content = numbered(40)
    messages = history(content)
    ex = exchange(messages, POLICY)
    ex.identity.key = ApiKey(name="alice", digest=b"")
    ex.identity.owner = "key:alice"
    ctx = context(CountingStore())
    out = await OffloadStage().run(ex, messages, ctx)

    assert out is not None and out is not messages and is_valid_pairing(out)
    assert [out[i] is messages[i] for i in range(5)] == [True, True, True, False, True]
    assert messages[3]["content"] == content  # the input list is never mutated
    ref = content_ref("s1", "tool_result", content.encode())
    assert out[3] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": pointer_text(content, ref, "read_file", "call_1", SMALL),
    }
    found = await ctx.store.get(ref)
    assert found is not None
    info, data = found
    assert data == content.encode()  # exactly the original
    assert (info.session, info.kind, info.owner, info.size) == (
        "s1",
        "tool_result",
        "key:alice",
        len(data),
    )
    assert info.meta == {
        "tool": "read_file",
        "tool_call_id": "call_1",
        "chars": len(content),
        "lines": 40,
        "tokens": 4 + -(-len(content) // 4),
    }
    (note,) = ex.notes
    assert (note.stage, note.action) == ("offload", "offloaded")
    assert note.fields["count"] == 1 and note.fields["refs"] == [ref]
    assert note.fields["tokens_before"] > note.fields["tokens_after"] > 0
    assert rewrites(ctx, "offloaded") == 1


def test_pointer_format() -> None:
    content = numbered(40)
    text = pointer_text(content, "ap_0123", "read_file", "call_1", SMALL)
    assert text == "\n".join(
        [
            "[agentproxy] This tool result was offloaded to keep the context small.",
            f"tool: read_file   call: call_1   size: {len(content):,} chars, 40 lines "
            f"(~{-(-len(content) // 4)} tokens)",
            "reference: ap_0123",
            'To read it, call the agentproxy_recall tool with {"ref": "ap_0123"}, or search '
            'this session\'s archive with {"query": "<phrase>"}; people can GET '
            "/v1/agentproxy/archive/ap_0123.",
            "Preview (first 2 and last 2 lines):",
            "     1  line 0001 xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "     2  line 0002 xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "     …  (36 lines omitted)",
            "    39  line 0039 xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "    40  line 0040 xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        ]
    )


def test_pointer_cuts_long_lines_and_shows_short_results_whole() -> None:
    content = "a" * 100 + "\r\nshort\n" + "b" * 41
    text = pointer_text(content, "ap_1", "grep", "c9", SMALL, recall=False)
    assert text.splitlines()[3:] == [
        "People can read it with GET /v1/agentproxy/archive/ap_1.",
        "Preview (all 3 lines):",
        "     1  " + "a" * 40 + "… (+60 chars)",
        "     2  short",
        "     3  " + "b" * 40 + "… (+1 chars)",
    ]


async def test_same_text_every_turn_and_after_a_restart(tmp_path: Path) -> None:
    content = numbered(60)
    turn1 = history(content, call_id="call_7", tool="run_tests")
    turn2 = [*turn1, {"role": "user", "content": "and now?"}]

    store = LocalStore(str(tmp_path))
    counting = CountingStore()
    stage = OffloadStage()
    first = await stage.run(exchange(turn1, POLICY), turn1, context(store))
    second = await stage.run(exchange(turn2, POLICY), turn2, context(store))
    await store.close()
    assert first is not None and second is not None
    assert second[: len(first)] == first  # appending to the input appends to the output
    assert "run_tests" in first[3]["content"] and "call_7" in first[3]["content"]

    # Warm: the same stage instance does not write the store again.
    warm = await stage.run(exchange(turn2, POLICY), turn2, context(counting))
    assert warm == second and counting.puts == 0

    # Restart: a new stage and a reopened store produce the same bytes; the ref resolves.
    reopened = LocalStore(str(tmp_path))
    again = await OffloadStage().run(exchange(turn2, POLICY), turn2, context(reopened))
    assert again == second
    ref = content_ref("s1", "tool_result", content.encode())
    found = await reopened.get(ref)
    await reopened.close()
    assert found is not None and found[1] == content.encode()


async def test_sessions_get_their_own_references() -> None:
    messages = history(numbered(40))
    ctx = context()
    one = await OffloadStage().run(exchange(messages, POLICY, session="a"), messages, ctx)
    two = await OffloadStage().run(exchange(messages, POLICY, session="b"), messages, ctx)
    assert one is not None and two is not None and one[3] != two[3]
    assert len(await ctx.store.blobs("a")) == len(await ctx.store.blobs("b")) == 1


async def test_store_failure_keeps_the_original_and_is_counted() -> None:
    messages = history(numbered(40))
    ex = exchange(messages, POLICY)
    ctx = context(BrokenStore())
    stage = OffloadStage()
    assert await stage.run(ex, messages, ctx) is None
    (note,) = ex.notes
    assert (note.stage, note.action, note.fields["count"]) == ("offload", "store_failed", 1)
    assert "disk is full" in note.fields["error"]
    assert rewrites(ctx, "store_failed") == 1
    # Nothing was cached: the next turn, with a working store, offloads.
    assert await stage.run(exchange(messages, POLICY), messages, context()) is not None


async def test_text_parts_are_offloaded_other_parts_left_alone() -> None:
    parts = [{"type": "text", "text": numbered(20)}, {"type": "text", "text": numbered(20)}]
    messages = history(parts)
    ctx = context()
    out = await OffloadStage().run(exchange(messages, POLICY), messages, ctx)
    assert out is not None and isinstance(out[3]["content"], str)
    joined = (parts[0]["text"] + "\n" + parts[1]["text"]).encode()
    assert await ctx.store.get(content_ref("s1", "tool_result", joined)) is not None

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    mixed = history([*parts, image])
    assert await OffloadStage().run(exchange(mixed, POLICY), mixed, context()) is None


async def test_recall_off_changes_the_instructions_and_name_falls_back() -> None:
    messages = history(numbered(40))
    messages[2] = {"role": "assistant", "content": "no calls here"}  # broken pairing: no name
    policy = Policy(name="t", offload=SMALL, recall=RecallSpec(enabled=False))
    out = await OffloadStage().run(exchange(messages, policy), messages, context())
    assert out is not None
    assert "agentproxy_recall" not in out[3]["content"]
    assert "tool: unknown   call: call_1" in out[3]["content"]


async def test_pointer_no_shorter_than_the_result_is_not_used() -> None:
    content = "\n".join("z" * 60 for _ in range(4))  # 4 lines, all shown in the preview
    spec = OffloadSpec(min_tokens=20, preview_lines=5, line_chars=1_000)
    messages = history(content)
    assert (
        await OffloadStage().run(exchange(messages, Policy("t", offload=spec)), messages, context())
        is None
    )


async def test_dry_run_still_computes() -> None:
    messages = history(numbered(40))
    ex = exchange(messages, Policy(name="t", mode="dry_run", offload=SMALL))
    assert await OffloadStage().run(ex, messages, context()) is not None
    assert ex.notes[0].action == "offloaded"


async def test_the_last_turn_memo_is_bounded_by_request_bytes() -> None:
    stage, ctx = OffloadStage(memo_bytes=10_000), context()
    for session in range(20):
        messages = history(numbered(40))
        ex = exchange(messages, POLICY, session=f"s{session}")
        ex.client.body_bytes = 3_000
        await stage.run(ex, messages, ctx)
    memo = stage.memos()["offload_turns"]
    assert len(memo) == 3 and memo.currsize == 9_000  # the three most recent sessions
