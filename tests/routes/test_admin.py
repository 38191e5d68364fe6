"""Hot reload through the file watcher and the admin API; admin authentication."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Fault, Simulator
from tests.conftest import ProxyFactory, base_url, sim_config

ADMIN = {"Authorization": "Bearer admin-secret"}


def policy_config(url: str, policy: str, extra_model: str = "") -> str:
    return sim_config(
        url,
        f"""
        keys:
          admin_key: admin-secret
        policies:
          - name: {policy}
            match: {{models: [sim]}}
        """,
        more_models=(extra_model,) if extra_model else (),
    )


async def get_json(http: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, Any]:
    async with http.get(url, **kw) as r:
        return r.status, await r.json()


async def test_valid_edit_takes_effect_without_restart(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    url = str(sim_server.make_url("")).rstrip("/")
    path = tmp_path / "c.yaml"
    path.write_text(policy_config(url, "first"))
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession() as http:
        _, before = await get_json(http, str(proxy.make_url("/admin/policies")), headers=ADMIN)
        path.write_text(policy_config(url, "second", extra_model="sim-two"))
        for _ in range(40):  # the watcher polls every second; allow ~2 s plus slack
            await asyncio.sleep(0.1)
            _, models = await get_json(http, base_url(proxy) + "/models")
            if len(models["data"]) == 2:
                break
        assert [m["id"] for m in models["data"]] == ["sim", "sim-two"]
        _, after = await get_json(http, str(proxy.make_url("/admin/policies")), headers=ADMIN)
    assert after["version"] != before["version"]
    assert after["policies"][0]["name"] == "second"
    assert after["last_reload"]["ok"] is True and after["last_reload"]["trigger"] == "watch"


async def test_invalid_edit_keeps_old_config_and_is_reported(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    url = str(sim_server.make_url("")).rstrip("/")
    path = tmp_path / "c.yaml"
    path.write_text(policy_config(url, "good"))
    proxy = await start_proxy(path, watch=False)
    path.write_text(policy_config(url, "good").replace("model: openai/sim", "model: 42"))
    async with aiohttp.ClientSession() as http:
        async with http.post(str(proxy.make_url("/admin/reload")), headers=ADMIN, json={}) as r:
            assert r.status == 422
            error = (await r.json())["error"]
        assert any("model_list[0].litellm_params.model" in line for line in error["details"])
        _status, shown = await get_json(http, str(proxy.make_url("/admin/policies")), headers=ADMIN)
        assert shown["last_reload"]["ok"] is False
        assert shown["policies"][0]["name"] == "good"
        body = {"model": "sim", "messages": [{"role": "user", "content": "still here?"}]}
        async with http.post(base_url(proxy) + "/chat/completions", json=body) as r:
            assert r.status == 200
        async with http.get(str(proxy.make_url("/metrics"))) as r:
            metrics = await r.text()
    assert 'agentproxy_config_reloads_total{result="failure"} 1.0' in metrics
    assert "agentproxy_config_last_reload_success 0.0" in metrics


async def test_request_in_flight_finishes_under_its_policy(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer, sim: Simulator
) -> None:
    url = str(sim_server.make_url("")).rstrip("/")
    path = tmp_path / "c.yaml"
    path.write_text(policy_config(url, "old"))
    proxy = await start_proxy(path, watch=False)
    sim.inject(Fault(delay_s=0.5))
    async with aiohttp.ClientSession() as http:
        body = {"model": "sim", "messages": [{"role": "user", "content": "slow"}]}
        slow = asyncio.ensure_future(http.post(base_url(proxy) + "/chat/completions", json=body))
        await asyncio.sleep(0.2)
        path.write_text(policy_config(url, "new"))
        async with http.post(str(proxy.make_url("/admin/reload")), headers=ADMIN, json={}) as r:
            assert r.status == 200
        response = await slow
        assert response.status == 200
        assert response.headers["x-agentproxy-policy"] == "old"
        async with http.post(base_url(proxy) + "/chat/completions", json=body) as r:
            assert r.headers["x-agentproxy-policy"] == "new"


async def test_admin_routes_need_the_admin_key(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(policy_config(str(sim_server.make_url("")).rstrip("/"), "p"))
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            status, body = await get_json(
                http, str(proxy.make_url("/admin/policies")), headers=headers
            )
            assert status == 401 and body["error"]["type"] == "authentication_error"
            async with http.post(
                str(proxy.make_url("/admin/reload")), headers=headers, json={}
            ) as r:
                assert r.status == 401


async def test_health_ready_and_metrics(proxy: TestServer) -> None:
    async with aiohttp.ClientSession() as http:
        assert (await get_json(http, str(proxy.make_url("/healthz"))))[0] == 200
        status, ready = await get_json(http, str(proxy.make_url("/readyz")))
        assert status == 200 and ready["status"] == "ready"
        body = {"model": "sim", "messages": [{"role": "user", "content": "count me"}]}
        async with http.post(base_url(proxy) + "/chat/completions", json=body) as r:
            assert r.status == 200
        async with http.get(str(proxy.make_url("/metrics"))) as r:
            text = await r.text()
    assert (
        'agentproxy_requests_total{model="sim",route="/v1/chat/completions",status="200"} 1.0'
        in text
    )
    assert 'agentproxy_tokens_total{kind="prompt",model="sim"}' in text
    assert "agentproxy_overhead_seconds_bucket" in text


SECRETS = ("hunter2", "s3cret-query-key", "sig-value")


async def test_admin_output_and_reload_errors_hide_url_credentials(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    host = str(sim_server.make_url("")).rstrip("/").removeprefix("http://")
    with_secrets = f"http://agent:hunter2@{host}/v1?api-key=s3cret-query-key&sig=sig-value"
    path = tmp_path / "c.yaml"
    path.write_text(policy_config(f"http://{host}", "p").replace(f"http://{host}/v1", with_secrets))
    proxy = await start_proxy(path, watch=False)
    # A reload the loader rejects for the api_base itself: the error quotes the value.
    path.write_text(path.read_text().replace("http://agent", "ftp://agent"))
    async with aiohttp.ClientSession() as http:
        async with http.post(str(proxy.make_url("/admin/reload")), headers=ADMIN, json={}) as r:
            assert r.status == 422
            rejected = await r.text()
        async with http.get(str(proxy.make_url("/admin/policies")), headers=ADMIN) as r:
            shown_text = await r.text()
            shown = await r.json()
    (model,) = shown["models"]["sim"]
    assert model["api_base"] == f"http://***@{host}/v1?api-key=***&sig=***"
    assert f"'ftp://***@{host}/v1?api-key=***&sig=***' is not an http(s) URL" in rejected
    for secret in SECRETS:
        assert secret not in rejected and secret not in shown_text
