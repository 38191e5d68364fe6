"""The ledger of what the agent touched (artifacts.py): extraction from each agent's tool calls,
as each wire's view shows them to the stages; its bounds; its merge into a summary; and, at
stage level, how it is carried from one compaction to the next, a restart included."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson

from proxy.messages import Message
from proxy.pipeline.compaction import CompactionStage
from proxy.pipeline.compaction.artifacts import (
    COMMAND_CHARS,
    DELETED,
    EDITED,
    EMPTY,
    MAX_COMMANDS,
    MAX_FILES,
    READ,
    WRITTEN,
    ArtifactLedger,
    patch_touches,
    shell_writes,
    touches,
)
from proxy.pipeline.compaction.checkpoints import Checkpoint, Mark
from proxy.pipeline.compaction.sections import section_span
from proxy.store.memory import MemoryStore
from proxy.wire.anthropic.view import AnthropicView
from proxy.wire.responses.view import ResponsesView
from tests.pipeline.compaction.factories import (
    Scripted,
    actions,
    call,
    coding_session,
    context,
    exchange,
    note,
)


def ledger_of(*calls: tuple[str, Any]) -> ArtifactLedger:
    messages: list[Message] = []
    for n, (name, arguments) in enumerate(calls):
        text = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
        function = {"name": name, "arguments": text}
        messages.append(
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": f"c{n}", "type": "function", "function": function}]}
        )  # fmt: skip
    return EMPTY.extended(messages)


# --- Claude Code ----------------------------------------------------------------------------


def test_claude_codes_tools_through_the_anthropic_view() -> None:
    def use(n: int, name: str, **arguments: Any) -> dict[str, Any]:
        block = {"type": "tool_use", "id": f"t{n}", "name": name, "input": arguments}
        return {"role": "assistant", "content": [{"type": "text", "text": "ok"}, block]}

    def done(n: int) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{n}"}]}

    calls = [
        use(0, "Read", file_path="/repo/README.md"),
        use(1, "Write", file_path="/repo/src/new.py", content="x = 1\n"),
        use(2, "Edit", file_path="/repo/src/old.py", old_string="a", new_string="b"),
        use(3, "MultiEdit", file_path="/repo/src/many.py", edits=[]),
        use(4, "NotebookEdit", notebook_path="/repo/nb.ipynb", new_source="x"),
        use(5, "Read", file_path="/repo/src/new.py"),  # a read after a write: still written
        use(6, "Bash", command="pytest -q > out.log && rm -f /repo/tmp.txt", description="t"),
        use(7, "Grep", pattern="TODO", path="/repo/src"),
    ]
    body = {"model": "m", "messages": [m for n, c in enumerate(calls) for m in (c, done(n))]}
    ledger = EMPTY.extended(AnthropicView.of(body).messages)
    assert dict(ledger.files) == {
        "/repo/README.md": READ,
        "/repo/src/new.py": WRITTEN,
        "/repo/src/old.py": EDITED,
        "/repo/src/many.py": EDITED,
        "/repo/nb.ipynb": EDITED,
        "out.log": WRITTEN,
        "/repo/tmp.txt": DELETED,
        "/repo/src": READ,
    }
    assert ledger.commands == ("pytest -q > out.log && rm -f /repo/tmp.txt",)


def test_the_last_action_wins_except_that_a_read_keeps_a_change() -> None:
    ledger = ledger_of(
        ("Write", {"file_path": "a.py"}),
        ("Bash", {"command": "rm a.py"}),
        ("Read", {"file_path": "b.py"}),
        ("Edit", {"file_path": "b.py"}),
        ("Read", {"file_path": "b.py"}),
        ("Write", {"file_path": "c.py"}),
        ("Bash", {"command": "rm c.py"}),
        ("Write", {"file_path": "c.py"}),
    )
    assert dict(ledger.files) == {"a.py": DELETED, "b.py": EDITED, "c.py": WRITTEN}
    assert [p for p, _ in ledger.files] == ["a.py", "b.py", "c.py"]  # least recent first


# --- Codex ----------------------------------------------------------------------------------

PATCH = """*** Begin Patch
*** Add File: src/added.py
+print("hi")
*** Update File: src/kept.py
@@ def f():
-    return 1
+    return 2
*** Update File: src/old_name.py
*** Move to: src/new_name.py
@@
-x
+y
*** Delete File: src/gone.py
*** End Patch
"""
PATCHED = {
    "src/added.py": WRITTEN,
    "src/kept.py": EDITED,
    "src/old_name.py": DELETED,
    "src/new_name.py": EDITED,
    "src/gone.py": DELETED,
}


def test_codexs_tools_through_the_responses_view() -> None:
    def function(n: int, name: str, **arguments: Any) -> list[dict[str, Any]]:
        text = orjson.dumps(arguments).decode()
        return [
            {"type": "function_call", "call_id": f"f{n}", "name": name, "arguments": text},
            {"type": "function_call_output", "call_id": f"f{n}", "output": "ok"},
        ]

    items = [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
        {"type": "custom_tool_call", "call_id": "p1", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "p1", "output": "Done!"},
        *function(1, "exec_command", cmd="cargo test", workdir="/repo"),
        *function(2, "shell", command=["bash", "-lc", "make build > build.log"]),
        *function(3, "shell", command=["ls", "-la", "my dir"]),
        *function(4, "shell_command", command="git status"),
        *function(5, "shell", command=["apply_patch", "*** Begin Patch\n*** Add File: b.md\n+x"]),
        *function(6, "apply_patch", input="*** Begin Patch\n*** Delete File: c.md\n*** End Patch"),
    ]
    ledger = EMPTY.extended(ResponsesView.of({"model": "m", "input": items}).messages)
    assert dict(ledger.files) == {**PATCHED, "build.log": WRITTEN, "b.md": WRITTEN, "c.md": DELETED}
    # The commands run, in order: an argv as a shell would quote it; apply_patch is no command.
    assert ledger.commands == (
        "cargo test", "make build > build.log", "ls -la 'my dir'", "git status",
    )  # fmt: skip


def test_a_patchs_paths_are_found_line_by_line() -> None:
    assert dict(patch_touches(PATCH)) == PATCHED
    assert patch_touches("*** Add File:   \n+x") == []  # no path: nothing
    assert patch_touches("+*** Add File: not/a/header.py") == []  # inside a hunk


# --- any tool naming a file -----------------------------------------------------------------


def test_any_tool_with_a_path_argument_counts_its_action_guessed_from_its_name() -> None:
    assert touches("read_file", '{"path": "a.txt"}') == ([("a.txt", READ)], None)
    assert touches("write_file", '{"path": "./b.txt"}') == ([("b.txt", WRITTEN)], None)
    assert touches("save_document", '{"filename": "c.md"}') == ([("c.md", WRITTEN)], None)
    assert touches("replace_in_file", '{"file_path": "d.py"}') == ([("d.py", EDITED)], None)
    assert touches("delete_file", '{"path": "e.py"}') == ([("e.py", DELETED)], None)
    assert touches("list_directory", '{"path": "src"}') == ([("src", READ)], None)
    # A text editor tool says what it does in `command`.
    editor = "str_replace_based_edit_tool"
    assert touches(editor, '{"command": "view", "path": "f.py"}') == ([("f.py", READ)], None)
    assert touches(editor, '{"command": "create", "path": "g.py"}') == ([("g.py", WRITTEN)], None)
    assert touches(editor, '{"command": "str_replace", "path": "h"}') == ([("h", EDITED)], None)
    # Not a path: nothing, never an error.
    for arguments in ('{"path": 3}', '{"path": ""}', '{"path": "a\\nb"}', "not json", "[1]", "{"):
        assert touches("read_file", arguments) == ([], None)
    assert touches("search", '{"query": "x"}') == ([], None)
    assert touches("read_file", '{"path": "' + "p" * 600 + '"}') == ([], None)


def test_only_a_shells_plain_writes_count() -> None:
    assert shell_writes("echo hi > a.txt; cat b >> log.txt") == [
        ("a.txt", WRITTEN),
        ("log.txt", EDITED),
    ]
    assert shell_writes("rm -rf build/ dist && git rm x") == [
        ("build/", DELETED),
        ("dist", DELETED),
    ]
    assert shell_writes("cmd 2>/dev/null >&2 2>&1") == []
    assert shell_writes('echo "a > b" > "$OUT"; rm *.o; echo x > `f`') == []
    assert shell_writes("cat > notes.md <<'EOF'\nrm all.txt\nEOF\nrm z") == [("notes.md", WRITTEN)]
    assert shell_writes("echo 'unbalanced > x") == []


# --- bounds -----------------------------------------------------------------------------------


def test_files_and_commands_are_capped_reads_leaving_first() -> None:
    calls = [("Write", {"file_path": f"w{i}.py"}) for i in range(10)]
    calls += [("Read", {"file_path": f"r{i:03}.py"}) for i in range(MAX_FILES)]
    calls += [("Bash", {"command": f"make step{i}"}) for i in range(MAX_COMMANDS + 5)]
    calls += [("Bash", {"command": "echo " + "x" * 1_000})]
    ledger = ledger_of(*calls)
    assert len(ledger.files) == MAX_FILES and ledger.more_files == 10
    kept = dict(ledger.files)
    assert all(f"w{i}.py" in kept for i in range(10))  # every change kept
    assert "r000.py" not in kept and "r255.py" in kept  # the oldest reads left
    assert len(ledger.commands) == MAX_COMMANDS and ledger.more_commands == 6
    assert ledger.commands[-1].endswith("…") and len(ledger.commands[-1]) == COMMAND_CHARS
    # Extending a capped ledger keeps its count of what it left out.
    assert ledger.extended([]).more_files == 10


def test_what_a_summary_gets_is_held_to_its_characters() -> None:
    ledger = ledger_of(*[("Write", {"file_path": f"src/file{i:02}.py"}) for i in range(40)])
    summary = "SESSION INTENT:\ng\n\nSUMMARY:\ns\n\nARTIFACTS:\n- src/file07.py\n\nNEXT STEPS:\nn"
    merged = ledger.merged_into(summary, 300)
    span = section_span(merged, "ARTIFACTS")
    assert span is not None
    section = merged[span[0] : span[1]]
    assert len(section) - len("\n- src/file07.py") <= 300 + 4
    assert section.count("src/file07.py") == 1  # named by the model: not repeated
    assert "- … and" in section and "more files" in section
    listed = [line for line in section.splitlines() if line.endswith("(written)")]
    assert listed == sorted(listed) and "- src/file39.py (written)" in listed  # newest first
    assert merged.endswith("NEXT STEPS:\nn")


# --- the merge --------------------------------------------------------------------------------


def test_the_ledger_joins_the_models_artifacts_without_duplicates() -> None:
    ledger = ledger_of(
        ("Write", {"file_path": "src/b.py"}),
        ("Write", {"file_path": "src/a.py"}),
        ("Read", {"file_path": "docs/c.md"}),
        ("Bash", {"command": "pytest -q"}),
    )
    summary = (
        "SESSION INTENT:\ng\n\nSUMMARY:\ns\n\n## Artifacts\n- src/b.py: the parser\n\n"
        "NEXT STEPS:\nn"
    )
    merged = ledger.merged_into(summary, 2_000)
    assert merged == (
        "SESSION INTENT:\ng\n\nSUMMARY:\ns\n\n## Artifacts\n- src/b.py: the parser\n"
        "Files the agent's tool calls touched (last action):\n"
        "- docs/c.md (read)\n- src/a.py (written)\n"
        "Commands the agent ran (the latest last):\n- `pytest -q`\n\n"
        "NEXT STEPS:\nn"
    )
    assert ledger.merged_into(summary, 2_000) == merged  # deterministic
    # A summary cut before its ARTIFACTS gets one at its end; an empty ledger changes nothing.
    cut = ledger.merged_into("SESSION INTENT:\ng\n\nSUMMARY:\ns …", 2_000)
    assert cut.startswith("SESSION INTENT:\ng\n\nSUMMARY:\ns …\n\nARTIFACTS:\n")
    assert "- src/b.py (written)" in cut
    assert EMPTY.merged_into(summary, 2_000) == summary


def test_it_travels_with_its_checkpoint() -> None:
    ledger = ledger_of(("Write", {"file_path": "a.py"}), ("Bash", {"command": "make"}))
    mark = Mark(4, "00000000000000ab")
    checkpoint = Checkpoint(mark, "summary", ({"role": "user", "content": "s"},), "ap_x", ledger)
    assert Checkpoint.from_bytes(mark, checkpoint.to_bytes()) == checkpoint
    older = orjson.dumps({"kind": "summary", "cut": 4, "ref": "ap_x", "messages": []})
    assert Checkpoint.from_bytes(mark, older).ledger == EMPTY  # written before the ledger
    assert ArtifactLedger.from_json({"files": [["a", "read"], "junk"], "commands": [1]}) == (
        ArtifactLedger((("a", "read"),), ("1",))
    )


# --- at stage level ---------------------------------------------------------------------------


def summary_of(out: list[Message]) -> str:
    texts = [m["content"] for m in out if "Earlier conversation summarized" in str(m["content"])]
    assert len(texts) == 1
    return str(texts[0])


def written_in(summary: str) -> tuple[list[int], int]:
    """The numbers of the src/modN.py files a summary lists as written, and how many more it
    says it left out."""
    listed = re.findall(r"^- src/mod(\d+)\.py \(written\)$", summary, re.MULTILINE)
    more = re.search(r"^- … and (\d+) more files$", summary, re.MULTILINE)
    return sorted(map(int, listed)), int(more.group(1)) if more else 0


async def test_written_files_are_carried_from_one_compaction_to_the_next_and_a_restart() -> None:
    """The scripted summarizer names no file at all; the summaries still account for every
    file the summarized stretches wrote (listed, the newest first, or counted in "and N more"
    when the room is short), the first compaction's ones carried into the second, also by a
    new stage (a restart) reading the first checkpoint from the store."""
    summarize = Scripted()  # ARTIFACTS: - none
    store = MemoryStore()
    history = coding_session(20, content_chars=280)
    first = await CompactionStage().run(exchange(history), history, context(summarize, store))
    assert first is not None
    listed, left_out = written_in(summary_of(first))
    assert listed and listed == list(range(left_out, left_out + len(listed)))
    carried = left_out + len(listed)  # files 0 .. carried-1 were written before the first cut
    grown = [*history, *coding_session(40, content_chars=280)[len(history) :]]
    ex = exchange(grown)  # a fresh process: the ledger comes from the store
    out = await CompactionStage().run(ex, grown, context(summarize, store))
    assert out is not None and actions(ex) == ["checkpoint_reused", "summarized"]
    listed, left_out = written_in(summary_of(out))
    assert listed == list(range(left_out, left_out + len(listed)))
    assert left_out + len(listed) > carried  # the first stretch's files and the second's


async def test_a_common_turn_never_walks_the_ledger() -> None:
    """A turn that reuses a checkpoint sends its summary as stored, ledger and all."""
    summarize, store = Scripted(), MemoryStore()
    history = coding_session(20, content_chars=280)
    first = await CompactionStage().run(exchange(history), history, context(summarize, store))
    assert first is not None
    longer = [*history, {"role": "assistant", "content": "done"}, call("x", "write_file", path="z")]
    longer.append({"role": "tool", "tool_call_id": "x", "content": "ok"})
    ex = exchange(longer)
    again = await CompactionStage().run(ex, longer, context(summarize, store))
    assert again is not None and actions(ex) == ["checkpoint_reused"]
    assert summary_of(again) == summary_of(first) and "- z (written)" not in summary_of(again)


async def test_a_summary_written_ahead_gets_the_ledger_too() -> None:
    """Written ahead, the summarizer is asked for its room less the ledger's share, and the
    crossing turn that takes it adds the ledger as an inline summary would."""
    summarize = Scripted()
    stage, ctx = CompactionStage(), context(summarize)
    rooms: list[tuple[int, int]] = []
    start = stage.prepared.start

    def starting(*args: Any) -> bool:
        rooms.append((args[5], args[6]))  # the room, and what of it is kept for the ledger
        return start(*args)

    stage.prepared.start = starting  # type: ignore[method-assign]
    for turns in range(2, 40):
        history = coding_session(turns, content_chars=280)
        ex = exchange(history)
        out = await stage.run(ex, history, ctx)
        await asyncio.sleep(0.01)  # the summary written ahead meanwhile
        if "summarized" in actions(ex):
            break
    assert out is not None and note(ex, "summarized").get("prepared") is True
    listed, left_out = written_in(summary_of(out))
    assert listed and listed == list(range(left_out, left_out + len(listed)))
    [(room, kept)] = rooms
    assert 0 < kept <= room // 4 and summarize.rooms == [room - kept]


def test_a_heredocs_body_is_never_read_as_commands() -> None:
    assert shell_writes("python - <<'EOF'\nimport os\nos.system('rm x')\nEOF\nrm y") == []
    assert shell_writes("ls\nrm y > z") == [("y", DELETED), ("z", WRITTEN)]
