"""Keys made at run time, over real sockets: made, listed, used (the openai SDK), rotated and
revoked through /admin/keys; checked as YAML keys are; kept across a restart; the YAML's keys
are left to the YAML; a team key sees its team's sessions."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory, base_url, sim_config

ADMIN_KEY = "admin-secret-for-keys"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
ALICE = "sk-yaml-alice-0001"


def keys_config(sim_url: str, state: Path, more: str = "") -> str:
    extra = textwrap.dedent(
        f"""\
        store: {{path: {state}}}
        keys:
          admin_key: {ADMIN_KEY}
          api_keys:
            - {{name: alice, key: {ALICE}, team: red}}
        """
    )
    return sim_config(sim_url, extra + more)


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, more: str = ""
) -> TestServer:
    path = tmp_path / "keys.yaml"
    path.write_text(keys_config(str(upstream.make_url("")).rstrip("/"), tmp_path / "state", more))
    return await start_proxy(path, watch=False)


async def call(
    proxy: TestServer, method: str, path: str, body: Any = None, headers: Any = None
) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        kwargs: dict[str, Any] = {"headers": ADMIN if headers is None else headers}
        if body is not None:
            kwargs["json"] = body
        async with http.request(method, str(proxy.make_url(path)), **kwargs) as response:
            return response.status, await response.json(content_type=None)


def client(proxy: TestServer, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(proxy), api_key=key, max_retries=0)


async def chat(proxy: TestServer, key: str, session: str = "s1") -> str:
    answer = await client(proxy, key).chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "hello"}],
        extra_headers={"x-agentproxy-session": session},
    )
    return answer.choices[0].message.content or ""


async def test_a_key_made_at_run_time_is_listed_used_rotated_and_revoked(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(Simulator().app()))
    body = {"name": "ci-bot", "team": "red", "limits": {"rpm": 100}, "models": ["sim"]}
    status, made = await call(proxy, "POST", "/admin/keys", body)
    assert status == 201, made
    secret = made["key"]
    assert secret.startswith("sk-ap-") and len(secret) > 40
    assert made["name"] == "ci-bot" and made["source"] == "store" and made["created_at"]
    assert "digest" not in made

    assert await chat(proxy, secret)  # the openai SDK, with the key made a moment ago

    status, listed = await call(proxy, "GET", "/admin/keys")
    assert status == 200
    by_name = {k["name"]: k for k in listed["keys"]}
    assert by_name["alice"]["source"] == "yaml"
    assert by_name["ci-bot"] == {
        "name": "ci-bot",
        "team": "red",
        "models": ["sim"],
        "limits": {"rpm": 100, "on_store_error": "allow"},
        "created_at": made["created_at"],
        "rotated_at": None,
        "source": "store",
    }
    assert secret not in str(listed) and "digest" not in str(listed)

    status, rotated = await call(proxy, "POST", "/admin/keys/ci-bot/rotate", {})
    assert status == 200, rotated
    assert rotated["key"] != secret and rotated["rotated_at"] >= made["created_at"]
    with pytest.raises(openai.AuthenticationError):
        await chat(proxy, secret)  # the old secret stops working at once
    assert await chat(proxy, rotated["key"])

    status, revoked = await call(proxy, "DELETE", "/admin/keys/ci-bot")
    assert (status, revoked) == (200, {"name": "ci-bot", "revoked": True})
    with pytest.raises(openai.AuthenticationError):
        await chat(proxy, rotated["key"])  # 401 at once
    status, _ = await call(proxy, "DELETE", "/admin/keys/ci-bot")
    assert status == 404
    assert await chat(proxy, ALICE)  # the YAML's key never moved


async def test_a_key_is_checked_as_a_yaml_key_is_and_errors_name_the_field(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(Simulator().app()))
    cases = [
        ({"name": "a", "limits": {"rpm": 0}}, "limits.rpm"),
        ({"name": "a", "limits": {}}, "limits"),
        ({"name": "a", "limits": {"rpms": 5}}, "limits.rpms"),
        ({"name": "a", "models": ["nope"]}, "models[0]"),
        ({"name": "a b"}, "name"),
        ({"team": "red"}, "'name' is a required property"),
        ({"name": "a", "colour": "red"}, "colour"),
        ({"name": "a", "key": "sk-my-own-choice"}, "key"),
        (["not", "an", "object"], "body"),
    ]
    for body, field in cases:
        status, answer = await call(proxy, "POST", "/admin/keys", body)
        assert status == 400, (body, answer)
        assert field in answer["error"]["message"], (body, answer)
    assert "sk-my-own-choice" not in str(answer)
    async with aiohttp.ClientSession() as http:
        url = str(proxy.make_url("/admin/keys"))
        async with http.post(
            url, data=b"{not json", headers={**ADMIN, "Content-Type": "application/json"}
        ) as r:
            assert r.status == 400
        async with http.post(
            url, data=b"x" * 20_000, headers={**ADMIN, "Content-Type": "application/json"}
        ) as r:
            assert r.status == 413
        async with http.post(url, data=b'{"name": "a"}', headers=ADMIN) as r:
            assert r.status == 415  # JSON only: no form a page could send
    status, _ = await call(proxy, "GET", "/admin/keys", headers={})
    assert status == 401


async def test_the_yamls_keys_are_changed_only_in_the_yaml(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(Simulator().app()))
    for method, path, body in (
        ("POST", "/admin/keys", {"name": "alice"}),
        ("DELETE", "/admin/keys/alice", None),
        ("POST", "/admin/keys/alice/rotate", {}),
    ):
        status, answer = await call(proxy, method, path, body)
        assert status == 409, answer
        assert answer["error"]["code"] == "key_in_configuration"
        assert "edit the YAML" in answer["error"]["message"]
    assert (await call(proxy, "POST", "/admin/keys", {"name": "bob"}))[0] == 201
    status, answer = await call(proxy, "POST", "/admin/keys", {"name": "bob"})
    assert status == 409 and answer["error"]["param"] == "name"
    assert (await call(proxy, "POST", "/admin/keys/nobody/rotate", {}))[0] == 404


async def test_keys_survive_a_restart_and_the_yaml_wins_a_name_said_at_load(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    aiohttp_server: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream = await aiohttp_server(Simulator().app())
    first = await start(start_proxy, tmp_path, upstream)
    _, bob = await call(first, "POST", "/admin/keys", {"name": "bob", "limits": {"rpm": 1}})
    _, carol = await call(first, "POST", "/admin/keys", {"name": "carol"})
    await first.close()

    # Restarted, with a YAML that now names a key "bob" too: the YAML's is used.
    caplog.set_level(logging.INFO)
    yaml_bob = "sk-yaml-bob-0002"
    path = tmp_path / "keys.yaml"
    path.write_text(
        path.read_text().replace("team: red}", f"team: red}}\n    - {{name: bob, key: {yaml_bob}}}")
    )
    second = await start_proxy(path, watch=False)
    assert await chat(second, carol["key"])  # made before the restart
    with pytest.raises(openai.AuthenticationError):
        await chat(second, bob["key"])
    assert await chat(second, yaml_bob)
    said = [r.getMessage() for r in caplog.records if "bob" in r.getMessage()]
    assert any("the configuration's is used" in line for line in said), said
    _, listed = await call(second, "GET", "/admin/keys")
    assert [k["source"] for k in listed["keys"] if k["name"] == "bob"] == ["yaml"]


async def test_a_run_time_keys_limits_apply(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(Simulator().app()))
    _, made = await call(proxy, "POST", "/admin/keys", {"name": "slow", "limits": {"rpm": 1}})
    assert await chat(proxy, made["key"])
    with pytest.raises(openai.RateLimitError):
        await chat(proxy, made["key"])
    assert await chat(proxy, ALICE)  # another key: its own window


async def test_a_run_time_team_key_sees_its_teams_sessions(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    path = tmp_path / "keys.yaml"
    url = str((await aiohttp_server(Simulator().app())).make_url("")).rstrip("/")
    config = keys_config(url, tmp_path / "state")
    path.write_text(config.replace("admin_key:", "session_scope: team\n  admin_key:"))
    proxy = await start_proxy(path, watch=False)
    _, red = await call(proxy, "POST", "/admin/keys", {"name": "dave", "team": "red"})
    _, blue = await call(proxy, "POST", "/admin/keys", {"name": "erin", "team": "blue"})
    await chat(proxy, ALICE, session="red-work")
    seen = {}
    for name, key in (("dave", red["key"]), ("erin", blue["key"])):
        status, listed = await call(
            proxy, "GET", "/admin/sessions", headers={"Authorization": f"Bearer {key}"}
        )
        assert status == 200, listed
        seen[name] = [(row["session"], row["owner"]) for row in listed["data"]]
    assert seen == {"dave": [("red-work", "team:red")], "erin": []}
