"""The audit, over real sockets: every admin action (keys made, rotated, revoked; reloads
applied, with what changed, or refused; admin authentication refused) is one JSON line in the
log and one entry at GET /admin/audit, paged; no entry nor line holds a secret."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.policies.spec import StoreSettings
from proxy.sim.simulator import Simulator
from proxy.store import admin_records, redis_admin
from proxy.store.admin_records import AdminRecords
from proxy.store.redis import RedisConnection
from tests.conftest import REDIS_URL, ProxyFactory
from tests.routes.test_runtime_keys import ADMIN_KEY, ALICE, call, keys_config, start

WRONG = "sk-wrong-admin-guess-1234"


async def test_every_admin_action_is_audited_and_no_entry_holds_a_secret(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    aiohttp_server: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    upstream = await aiohttp_server(Simulator().app())
    proxy = await start(start_proxy, tmp_path, upstream)
    _, made = await call(proxy, "POST", "/admin/keys", {"name": "bot", "team": "red"})
    _, rotated = await call(proxy, "POST", "/admin/keys/bot/rotate", {})
    assert (await call(proxy, "DELETE", "/admin/keys/bot"))[0] == 200

    path = tmp_path / "keys.yaml"
    url = str(upstream.make_url("")).rstrip("/")
    policy = "policies:\n  - {name: careful, match: {models: [sim]}}\n"
    path.write_text(keys_config(url, tmp_path / "state", policy))
    assert (await call(proxy, "POST", "/admin/reload", {}))[0] == 200
    path.write_text(path.read_text().replace("model: openai/sim", "model: 42"))
    assert (await call(proxy, "POST", "/admin/reload", {}))[0] == 422
    wrong = {"Authorization": f"Bearer {WRONG}"}
    assert (await call(proxy, "POST", "/admin/keys", {"name": "x"}, headers=wrong))[0] == 401
    assert (await call(proxy, "GET", "/admin/policies?key=" + WRONG, headers={}))[0] == 401

    status, page = await call(proxy, "GET", "/admin/audit")
    assert status == 200, page
    entries = page["entries"]
    assert [e["action"] for e in entries] == [
        "admin.auth_failed",
        "admin.auth_failed",
        "config.reload_refused",
        "config.reload",
        "key.revoke",
        "key.rotate",
        "key.create",
    ]
    ids = [e["id"] for e in entries]
    assert ids == sorted(ids, reverse=True)  # newest first
    failed, other_failed, refused, reloaded, revoked, rotated_one, created = entries
    assert created["who"] == "admin_key" and created["from"] == "127.0.0.1"
    assert created["key"] == {"name": "bot", "team": "red", "models": None, "limits": None}
    assert revoked["key"] == {"name": "bot"} and rotated_one["key"]["name"] == "bot"
    assert reloaded["trigger"] == "admin" and reloaded["who"] == "admin_key"
    assert reloaded["changes"]["policies"] == {"added": ["careful"], "removed": [], "changed": []}
    assert reloaded["changes"]["keys"] == {"added": [], "removed": [], "changed": []}
    assert any("model_list[0].litellm_params.model" in e for e in refused["errors"])
    assert failed["who"] == "unknown" and failed["path"] == "/admin/policies"
    assert failed["presented_key"] is True and other_failed["path"] == "/admin/keys"

    # Paged: two at a time, newest first, then oldest first.
    _, first = await call(proxy, "GET", "/admin/audit?limit=2")
    assert [e["id"] for e in first["entries"]] == ids[:2] and first["has_more"]
    _, second = await call(proxy, "GET", f"/admin/audit?limit=2&after={first['next_after']}")
    assert [e["id"] for e in second["entries"]] == ids[2:4]
    _, oldest = await call(proxy, "GET", "/admin/audit?order=oldest&limit=3")
    assert [e["id"] for e in oldest["entries"]] == ids[::-1][:3]
    _, last = await call(proxy, "GET", f"/admin/audit?order=oldest&after={ids[1]}")
    assert [e["id"] for e in last["entries"]] == ids[:1] and not last["has_more"]
    assert (await call(proxy, "GET", "/admin/audit?limit=0"))[0] == 400
    assert (await call(proxy, "GET", "/admin/audit?order=sideways"))[0] == 400
    assert (await call(proxy, "GET", "/admin/audit", headers={}))[0] == 401

    # One JSON line each in the log, the same entries.
    lines = [r.getMessage() for r in caplog.records if r.name == "agentproxy.audit"]
    logged = [orjson.loads(line)["action"] for line in lines]
    assert logged[:7] == [e["action"] for e in reversed(entries)]

    everything = "\n".join(r.getMessage() for r in caplog.records) + str(page) + str(oldest)
    for secret in (made["key"], rotated["key"], WRONG, ADMIN_KEY, ALICE):
        assert secret not in everything
    for digest_like in (made["key"][6:], rotated["key"][6:]):
        assert digest_like not in everything


async def test_the_file_watchers_reload_is_audited_as_the_watchers(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    upstream = await aiohttp_server(Simulator().app())
    url = str(upstream.make_url("")).rstrip("/")
    path = tmp_path / "keys.yaml"
    path.write_text(keys_config(url, tmp_path / "state"))
    proxy = await start_proxy(path)  # watching its file
    more = "  - model_name: sim-two\n    litellm_params: {model: openai/sim-two, api_base: x}\n"
    text = path.read_text().replace("model_list:\n", "model_list:\n" + more)
    path.write_text(text.replace("api_base: x", f"api_base: {url}/v1"))
    for _ in range(60):
        await asyncio.sleep(0.1)
        _, page = await call(proxy, "GET", "/admin/audit")
        if page["entries"]:
            break
    (entry,) = page["entries"]
    assert entry["action"] == "config.reload" and entry["who"] == "watch"
    assert entry["from"] is None
    assert entry["changes"]["aliases"] == {"added": ["sim-two"], "removed": [], "changed": []}


@pytest.mark.parametrize("backend", ["local", "redis"])
async def test_the_audit_is_kept_under_the_stores_retention_and_bounded(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_records, "AUDIT_MAX_ENTRIES", 3)
    monkeypatch.setattr(redis_admin, "AUDIT_MAX_ENTRIES", 3)
    records: AdminRecords
    connection = None
    if backend == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        settings = StoreSettings(backend="redis", url=REDIS_URL, prefix=prefix)
        connection = RedisConnection(settings)
        records = redis_admin.RedisAdminRecords(connection)
    else:
        records = admin_records.LocalAdminRecords(str(tmp_path))
    now = time.time()
    await records.append_audit({"at": now - 100, "action": "key.create"}, keep_s=3600)
    await records.append_audit({"at": now - 50, "action": "key.rotate"}, keep_s=3600)
    await records.append_audit({"at": now, "action": "key.revoke"}, keep_s=60)
    left = await records.audit(None, 10, "newest")
    assert [(e["id"], e["action"]) for e in left] == [(3, "key.revoke"), (2, "key.rotate")]
    for n in range(3):
        await records.append_audit({"at": time.time(), "action": f"a{n}"}, keep_s=3600)
    newest = await records.audit(None, 10, "newest")
    assert [e["action"] for e in newest] == ["a2", "a1", "a0"]  # at most AUDIT_MAX_ENTRIES
    assert [e["id"] for e in await records.audit(5, 10, "oldest")] == [6]
    assert [e["id"] for e in await records.audit(5, 10, "newest")] == [4]
    await records.close()
    if connection is not None:
        await connection.close()
