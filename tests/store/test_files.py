"""What the proxy keeps on disk is its user's alone: the SQLite store (its -wal and -shm too,
which SQLite creates with the database's modes), the event log (each file rotation makes) and
`run`'s log are 0600 in folders made 0700, under the usual umask 022."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.recording.events import _Lines
from proxy.state import EVENTS, RECORDINGS
from proxy.store.local import LocalStore
from tests.conftest import ProxyFactory, base_url


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    before = os.umask(0o022)
    yield
    os.umask(before)


def modes(folder: Path) -> dict[str, str]:
    """Every entry under `folder` and its permission bits, in octal."""
    return {
        str(path.relative_to(folder)): oct(stat.S_IMODE(path.stat().st_mode))
        for path in sorted(folder.rglob("*"))
    }


async def test_a_served_proxys_store_and_event_log_are_private(
    start_proxy: ProxyFactory, sim_server: TestServer, tmp_path: Path
) -> None:
    state = tmp_path / "data" / "state"
    path = tmp_path / "agentproxy.yaml"
    url = str(sim_server.make_url("")).rstrip("/")
    path.write_text(textwrap.dedent(f"""\
        store: {{path: {state}}}
        model_list:
          - model_name: sim
            litellm_params:
              {{model: openai/sim, api_base: {url}/v1, api_key: sk-sim-upstream-secret}}
            model_info: {{max_input_tokens: 100000}}
        policies:
          - name: kept
            offload: {{min_tokens: 100}}
            record: {{enabled: true}}
        """))  # fmt: skip
    proxy = await start_proxy(path)
    client = openai.AsyncOpenAI(base_url=base_url(proxy), api_key="any", max_retries=0)
    messages: Any = [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a private line\n" * 400},
    ]  # fmt: skip
    raw = await client.chat.completions.with_raw_response.create(model="sim", messages=messages)
    await client.close()
    assert "offload" in raw.headers["x-agentproxy-applied"]  # the store was written
    await proxy.app[RECORDINGS].flush()
    proxy.app[EVENTS].flush()
    found = modes(tmp_path / "data")
    for name in ("store.sqlite3", "store.sqlite3-wal", "store.sqlite3-shm", "events.jsonl"):
        assert f"state/{name}" in found, found
    assert found == {
        "state": "0o700",
        **{name: "0o600" for name in found if name != "state"},
    }


async def test_a_store_made_before_is_narrowed_when_opened(tmp_path: Path) -> None:
    old = sqlite3.connect(tmp_path / "store.sqlite3")
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("CREATE TABLE t (x)")  # the -wal and -shm exist while it is open
    before = modes(tmp_path)
    assert set(before.values()) == {"0o644"}, before
    store = LocalStore(str(tmp_path))
    await store.open()
    await store.close()
    old.close()
    assert set(modes(tmp_path).values()) == {"0o600"}, modes(tmp_path)


def test_each_file_the_event_log_rotates_to_is_private(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    log = _Lines(str(tmp_path / "logs" / "events.jsonl"), maxBytes=20, backupCount=2)
    for n in range(5):
        log.emit(logging.LogRecord("events", logging.INFO, "", 0, f'{{"line": {n}}}', None, None))
    log.close()
    assert modes(tmp_path / "logs") == {
        "events.jsonl": "0o600", "events.jsonl.1": "0o600", "events.jsonl.2": "0o600"
    }  # fmt: skip
