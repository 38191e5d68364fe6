"""The event log: lines leave the event loop, rotate by size, and none is lost or split."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.recording import events as events_module
from proxy.recording.events import EventLog
from proxy.state import EVENTS
from tests.conftest import ProxyFactory, base_url, sim_config
from tests.pipeline.factories import exchange


def lines_of(path: Path, keep: int) -> list[dict[str, object]]:
    """Every line of the log and its rotated files, oldest first."""
    files = [path.with_name(f"{path.name}.{n}") for n in range(keep, 0, -1)] + [path]
    return [orjson.loads(line) for f in files if f.exists() for line in f.read_bytes().splitlines()]


def sizes(folder: Path) -> list[int]:
    """The sizes of events.jsonl, then of its rotated files."""
    return [f.stat().st_size for f in sorted(folder.glob("events.jsonl*"))]


async def test_a_thousand_writers_lose_no_line_across_rotations(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    events = EventLog(str(path), max_mb=0.02, keep=400)  # ~20 KB a file: ~70 rotations
    ex = exchange([{"role": "user", "content": "hi"}])

    async def writer(n: int) -> None:
        for i in range(5):
            events.write(ex, "test", "wrote", {"n": n * 5 + i, "pad": "x" * 200})
            await asyncio.sleep(0)

    await asyncio.gather(*(writer(n) for n in range(1000)))
    events.flush()
    written = lines_of(path, 400)
    assert sorted(int(str(e["n"])) for e in written) == list(range(5000))
    rotated = sizes(tmp_path)[1:]
    assert len(rotated) > 50 and all(size <= 21_000 for size in rotated)
    events.close()


def test_the_oldest_files_go_beyond_keep(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    events = EventLog(str(path), max_mb=0.001, keep=2)
    ex = exchange([{"role": "user", "content": "hi"}])
    for n in range(100):
        events.write(ex, "test", "wrote", {"n": n, "pad": "x" * 100})
    events.flush()
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        "events.jsonl",
        "events.jsonl.1",
        "events.jsonl.2",
    ]
    assert int(str(lines_of(path, 2)[-1]["n"])) == 99  # the newest kept
    events.close()


async def test_writing_happens_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writers: list[threading.Thread] = []
    emit = events_module._Lines.emit

    def recorded(self: logging.Handler, record: logging.LogRecord) -> None:
        writers.append(threading.current_thread())
        emit(self, record)  # type: ignore[arg-type]

    monkeypatch.setattr(events_module._Lines, "emit", recorded)
    path = tmp_path / "events.jsonl"
    events = EventLog(str(path))
    events.write(exchange([]), "test", "first", {})
    events.flush()
    assert writers and threading.current_thread() not in writers
    assert lines_of(path, 0)[0]["action"] == "first"
    events.close()


def test_an_unwritable_path_never_fails_a_request(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    events = EventLog(str(tmp_path / "file" / "events.jsonl"))
    events.write(exchange([]), "test", "lost", {})  # said in the log, not raised
    events.close()


async def test_the_proxy_rotates_its_event_log_as_configured_and_loses_no_line(
    start_proxy: ProxyFactory, sim_server: TestServer, tmp_path: Path
) -> None:
    """Over real sockets: 300 repaired requests, 8 at a time, each one event line; the log
    rotates at the configured size and every line is in one of the files."""
    path = tmp_path / "rotating.yaml"
    state = tmp_path / "state"
    extra = f"store: {{path: {state}, event_log_max_mb: 0.02, event_log_keep: 500}}\n"
    path.write_text(sim_config(str(sim_server.make_url("")).rstrip("/"), extra))
    proxy = await start_proxy(path)
    client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key="k", max_retries=0)
    dangling = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}

    async def turn(n: int) -> None:
        messages = [
            {"role": "user", "content": f"task {n}"},
            {"role": "assistant", "content": None, "tool_calls": [dangling]},
            {"role": "user", "content": "go on"},
        ]
        await client.chat.completions.create(
            model="sim", messages=messages, extra_headers={"x-agentproxy-session": f"s{n}"}
        )

    for start in range(0, 300, 8):
        await asyncio.gather(*(turn(n) for n in range(start, min(start + 8, 300))))
    proxy.app[EVENTS].flush()
    lines = lines_of(state / "events.jsonl", 500)
    patched = sorted(e["session"] for e in lines if e["action"] == "patched_dangling")
    assert patched == sorted(f"s{n}" for n in range(300))
    assert len(sizes(state)) >= 3 and max(sizes(state)) <= 21_000
