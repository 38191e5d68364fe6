"""Hot reload never applies a file caught mid-write, nor one that would drop authentication
(issue 29 §5). Over real sockets, through the real file watcher."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory, sim_config

KEY = "sk-reload-alice"
ROTATED = "sk-reload-alice-2"
ADMIN = "sk-reload-admin"
BODY = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}


def config(
    url: str, *, aliases: tuple[str, ...], key: str | None = KEY, settle: float = 0.6
) -> str:
    """Server settings first, keys last: a file cut short loses its keys and later aliases."""
    server = f"server: {{watch_interval_s: 0.1, reload_settle_s: {settle}}}\n"
    keys = textwrap.dedent(
        f"""\
        keys:
          admin_key: {ADMIN}
          api_keys: [{{name: alice, key: {key}}}]
        """
    )
    return server + sim_config(url, keys if key else "", more_models=aliases)


async def models_seen(http: aiohttp.ClientSession, proxy: TestServer, key: str) -> list[str]:
    headers = {"Authorization": f"Bearer {key}"}
    async with http.get(str(proxy.make_url("/v1/models")), headers=headers) as r:
        assert r.status == 200, await r.text()
        return [m["id"] for m in (await r.json())["data"]]


async def status_without_key(http: aiohttp.ClientSession, proxy: TestServer) -> int:
    async with http.post(str(proxy.make_url("/v1/chat/completions")), json=BODY) as r:
        return r.status


async def policies(http: aiohttp.ClientSession, proxy: TestServer) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with http.get(str(proxy.make_url("/admin/policies")), headers=headers) as r:
        assert r.status == 200
        shown: dict[str, Any] = await r.json()
        return shown


async def test_a_config_written_in_two_halves_is_applied_only_whole(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    """The first half is valid YAML and a valid config (one alias, no keys): applied, it
    would drop two aliases and serve loopback clients without a key."""
    url = str(sim_server.make_url("")).rstrip("/")
    path = tmp_path / "c.yaml"
    path.write_text(config(url, aliases=("sim-two",)))
    proxy = await start_proxy(path)
    whole = config(url, aliases=("sim-two", "sim-three"))
    half = whole[: whole.index("  - model_name: sim-two")]
    seen: set[tuple[str, ...]] = set()
    open_statuses: set[int] = set()
    async with aiohttp.ClientSession() as http:

        async def observe() -> None:
            while True:
                seen.add(tuple(sorted(await models_seen(http, proxy, KEY))))
                open_statuses.add(await status_without_key(http, proxy))
                await asyncio.sleep(0.02)

        observer = asyncio.create_task(observe())
        with path.open("w") as file:  # truncated, then written in two halves
            file.write(half)
            file.flush()
            await asyncio.sleep(0.4)  # a slow writer: longer than the watcher's poll
            file.write(whole[len(half) :])
        for _ in range(60):
            await asyncio.sleep(0.1)
            if ("sim", "sim-three", "sim-two") in seen:
                break
        observer.cancel()
        shown = await policies(http, proxy)
    assert seen <= {("sim", "sim-two"), ("sim", "sim-three", "sim-two")}, seen
    assert ("sim", "sim-three", "sim-two") in seen
    assert open_statuses == {401}
    assert shown["last_reload"]["ok"] is True


async def test_a_reload_that_drops_the_keys_is_refused_and_auth_still_holds(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    url = str(sim_server.make_url("")).rstrip("/")
    path = tmp_path / "c.yaml"
    path.write_text(config(url, aliases=(), settle=0.1))
    proxy = await start_proxy(path)
    path.write_text(config(url, aliases=("sim-two",), key=None, settle=0.1))  # whole, no keys
    async with aiohttp.ClientSession() as http:
        for _ in range(50):
            await asyncio.sleep(0.1)
            shown = await policies(http, proxy)
            if shown["last_reload"] is not None:
                break
        assert shown["last_reload"]["ok"] is False, shown["last_reload"]
        assert any("keys" in line for line in shown["last_reload"]["errors"])
        assert await models_seen(http, proxy, KEY) == ["sim"]  # the old config serves
        assert await status_without_key(http, proxy) == 401
        headers = {"Authorization": f"Bearer {KEY}"}
        async with http.post(
            str(proxy.make_url("/v1/chat/completions")), json=BODY, headers=headers
        ) as r:
            assert r.status == 200
        async with http.get(str(proxy.make_url("/metrics"))) as r:
            metrics = await r.text()
    assert 'agentproxy_config_reloads_total{result="failure"} 1.0' in metrics
    assert "agentproxy_config_last_reload_success 0.0" in metrics


async def test_a_normal_edit_still_applies(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    """A key rotated and an alias added: applied once the file is still, the old key gone."""
    url = str(sim_server.make_url("")).rstrip("/")
    path = tmp_path / "c.yaml"
    path.write_text(config(url, aliases=(), settle=0.2))
    proxy = await start_proxy(path)
    path.write_text(config(url, aliases=("sim-two",), key=ROTATED, settle=0.2))
    async with aiohttp.ClientSession() as http:
        for _ in range(50):
            await asyncio.sleep(0.1)
            shown = await policies(http, proxy)
            if shown["last_reload"] is not None:
                break
        assert shown["last_reload"]["ok"] is True, shown["last_reload"]
        assert await models_seen(http, proxy, ROTATED) == ["sim", "sim-two"]
        async with http.get(
            str(proxy.make_url("/v1/models")), headers={"Authorization": f"Bearer {KEY}"}
        ) as r:
            assert r.status == 401
