"""`agentproxy store stats | gc` as an operator runs them, on both backends."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from proxy.metrics import Metrics
from proxy.policies.spec import StoreSettings
from proxy.store.backends import open_backends
from proxy.store.base import BlobInfo, content_ref
from tests.conftest import REDIS_URL, sim_config
from tests.test_cli import agentproxy

DAY = 86400.0


@pytest.fixture(params=["local", "redis"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if request.param == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        store = f"store: {{backend: redis, url: '{REDIS_URL}', prefix: '{prefix}', max_mb: 1}}\n"
    else:
        store = f"store: {{path: {tmp_path / 'data'}, max_mb: 1}}\n"
    file = tmp_path / "agentproxy.yaml"
    file.write_text(sim_config("http://127.0.0.1:9911") + store)
    return file


async def seed(config: Path) -> None:
    from proxy.policies.loader import load_config

    settings: StoreSettings = load_config(config).store
    backends = open_backends(settings, Metrics())
    now = time.time()
    try:
        for session, at in (("key:a/old", now - 8 * DAY), ("key:a/new", now)):
            data = f"the payload of {session}".encode()
            ref = content_ref(session, "tool_result", data)
            info = BlobInfo(ref, session, "tool_result", len(data), at, "key:a", {})
            await backends.store.put(info, data)
    finally:
        await backends.store.close()
        await backends.state.close()


async def test_stats_then_gc_then_stats(config: Path) -> None:
    await seed(config)
    before = agentproxy("store", "stats", "--config", str(config), "--json")
    assert before.returncode == 0, before.stderr
    found = json.loads(before.stdout)
    assert (found["sessions"], found["blobs"], found["max_bytes"]) == (2, 2, 1024 * 1024)
    assert found["live_sessions"] == 1

    gc = agentproxy("store", "gc", "--config", str(config))
    assert gc.returncode == 0, gc.stderr
    assert "expired  1 session(s) idle past store.session_ttl" in gc.stdout

    after = agentproxy("store", "stats", "--config", str(config))
    assert after.returncode == 0, after.stderr
    assert "sessions       1, 1 live" in after.stdout


def test_a_bad_config_is_refused_with_its_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("store: {session_ttl: 1h, live_s: 7200}\n")
    result = agentproxy("store", "gc", "--config", str(bad))
    assert result.returncode == 2
    assert "session_ttl (3600s) is shorter than live_s (7200s)" in result.stderr
