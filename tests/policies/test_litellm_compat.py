"""A LiteLLM proxy config.yaml, loaded as it is and served by a real proxy over sockets."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from proxy.policies.loader import ConfigError, load_config, validate_paths
from proxy.policies.spec import FallbackSpec
from proxy.sim.simulator import Fault, Simulator
from tests.conftest import ProxyFactory, base_url
from tests.test_cli import ROOT, start_serve

# Shipped for users (docs/configuration.md points at it), written the way LiteLLM's
# documentation writes its proxy config: bare model names, rpm/tpm, keys from the environment,
# its three settings sections and environment_variables. Its deployments call the simulator.
EXAMPLE = ROOT / "examples" / "litellm-config.yaml"
SIM = "http://127.0.0.1:9911"


def litellm_config(tmp_path: Path, small: str = SIM, mini: str = SIM, large: str = SIM) -> Path:
    """The example, its three simulator deployments (in order) pointed at these URLs."""
    text = EXAMPLE.read_text()
    assert text.count(SIM) == 3
    for url in (small, mini, large):
        text = text.replace(SIM, url, 1)
    path = tmp_path / "config.yaml"
    path.write_text(f"{text}\nstore: {{path: {tmp_path / 'state'}}}\n")
    return path


def line_of(text: str) -> int:
    """The example's line that holds `text` (its first)."""
    (number,) = [n for n, line in enumerate(EXAMPLE.read_text().splitlines(), 1) if text in line][
        :1
    ]
    return number


# --- what the loader makes of it ---------------------------------------------------------------


def test_the_settings_that_have_an_equivalent_are_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SIM_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-the-process")
    config = load_config(litellm_config(tmp_path))

    policy = config.default_policy
    assert (policy.retry.attempts, policy.retry.attempt_timeout_s) == (2, 30.0)
    assert (policy.circuit.failures, policy.circuit.cooldown_s) == (4, 30.0)
    assert policy.fallbacks == (
        FallbackSpec("gpt-4o", ("gpt-4o-128k",), ("overflow",)),
        FallbackSpec("gpt-4o", ("gpt-4o-mini",), ("transient",)),
    )
    assert config.select_policy("gpt-4o", None, {}) is policy
    (gpt4o,) = config.deployments["gpt-4o"]
    assert (gpt4o.model, gpt4o.fast_path) == ("openai/gpt-4o", True)
    # environment_variables win over the process environment, as LiteLLM sets them.
    assert gpt4o.api_key == "sk-sim-upstream-secret"
    assert config.deployments["claude-sonnet"][0].api_key == "sk-ant-from-the-config"
    # master_key: the admin key, and an API key for every model.
    assert config.keys.is_admin("sk-1234")
    master = config.keys.find("sk-1234")
    assert master is not None and (master.name, master.models) == ("master", None)


def test_the_shipped_example_validates_as_it_is() -> None:
    errors, warnings = validate_paths([str(EXAMPLE)])
    assert errors == []
    assert sum("LiteLLM settings with no equivalent here" in w for w in warnings) == 1


def test_what_does_not_map_is_named_in_one_warning_with_its_line(tmp_path: Path) -> None:
    path = litellm_config(tmp_path)
    config = load_config(path)

    (warning,) = [w for w in config.warnings if "LiteLLM" in w]
    rate = (
        "(per-deployment rate limits are not enforced; budgets (window: minute, limits: calls, "
        "tokens) cap a key, a team or everyone)"
    )
    assert warning.splitlines() == [
        f"{path}: LiteLLM settings with no equivalent here, not applied:",
        f"  {path}:{line_of('rpm: 480')}: model_list[0].litellm_params.rpm {rate}",
        f"  {path}:{line_of('tpm: 100000')}: model_list[0].litellm_params.tpm {rate}",
        f"  {path}:{line_of('temperature')}: model_list[1].litellm_params.temperature (not "
        "sent: 'gpt-4o-mini' is called directly)",
        f"  {path}:{line_of('tpm: 20000')}: model_list[3].tpm {rate}",
        f"  {path}:{line_of('rpm: 3')}: model_list[3].rpm {rate}",
        f"  {path}:{line_of('drop_params')}: litellm_settings.drop_params",
        f"  {path}:{line_of('set_verbose')}: litellm_settings.set_verbose",
        f"  {path}:{line_of('success_callback')}: litellm_settings.success_callback",
        f"  {path}:{line_of('routing_strategy')}: router_settings.routing_strategy (a session "
        "keeps to one deployment of an alias: routing.affinity)",
        f"  {path}:{line_of('redis_host')}: router_settings.redis_host (state is shared through "
        "store: {backend: redis, url: ...})",
        f"  {path}:{line_of('redis_port')}: router_settings.redis_port (state is shared through "
        "store: {backend: redis, url: ...})",
        f"  {path}:{line_of('database_url')}: general_settings.database_url (keys are "
        "configured in keys.api_keys)",
        f"  {path}:{line_of('store_model_in_db')}: general_settings.store_model_in_db",
    ]
    assert "postgresql" not in warning  # names, never values
    assert f"LiteLLM {path}: litellm_settings.num_retries: 1 -> retry.attempts: 2" in config.notes


def test_validate_prints_the_warning_once(tmp_path: Path) -> None:
    path = litellm_config(tmp_path)
    errors, warnings = validate_paths([str(path)])
    assert errors == []
    assert sum("LiteLLM settings with no equivalent here" in w for w in warnings) == 1


def test_policies_start_from_the_litellm_settings_and_their_own_keys_win(tmp_path: Path) -> None:
    path = litellm_config(tmp_path)
    path.write_text(
        path.read_text()
        + textwrap.dedent(
            """\
            policies:
              - name: careful
                match: {models: [gpt-4o]}
                retry: {attempts: 5}
                fallbacks: [{from: gpt-4o, to: [claude-sonnet], when: [transient]}]
              - name: plain
            """
        )
    )
    careful, plain = load_config(path).policies

    assert (careful.retry.attempts, careful.retry.attempt_timeout_s) == (5, 30.0)
    assert careful.circuit.failures == 4
    transient = careful.fallback_for("gpt-4o", "transient")
    assert transient is not None and transient.to == ("claude-sonnet",)
    overflow = careful.fallback_for("gpt-4o", "overflow")
    assert overflow is not None and overflow.to == ("gpt-4o-128k",)  # inherited
    assert plain.retry.attempts == 2 and len(plain.fallbacks) == 2


def test_router_settings_win_and_the_loser_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            model_list:
              - {model_name: a, litellm_params: {model: openai/a, api_base: "http://127.0.0.1:1/v1"}}
              - {model_name: b, litellm_params: {model: openai/b, api_base: "http://127.0.0.1:1/v1"}}
            litellm_settings: {num_retries: 1, fallbacks: [{a: [b]}]}
            router_settings: {num_retries: 4}
            """
        )
    )
    config = load_config(path)

    assert config.default_policy.retry.attempts == 5
    assert config.default_policy.fallbacks == (
        FallbackSpec("a", ("b",), ("transient", "overflow")),
    )
    (warning,) = config.warnings
    assert (
        f"{path}:4: litellm_settings.num_retries (router_settings.num_retries is used)" in warning
    )


def test_a_second_chain_for_an_alias_and_a_fallback_to_itself_are_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            model_list:
              - {model_name: a, litellm_params: {model: openai/a, api_base: "http://127.0.0.1:1/v1"}}
              - {model_name: b, litellm_params: {model: openai/b, api_base: "http://127.0.0.1:1/v1"}}
            litellm_settings:
              fallbacks: [{a: [a, b]}, {a: [b]}]
            """
        )
    )
    config = load_config(path)

    assert config.default_policy.fallbacks == (
        FallbackSpec("a", ("b",), ("transient", "overflow")),
    )
    (warning,) = config.warnings
    assert warning.splitlines()[1:] == [
        f"  {path}:5: litellm_settings.fallbacks[0].a[0] (an alias does not fall back to itself)",
        f"  {path}:5: litellm_settings.fallbacks[1].a (an earlier entry is used)",
    ]


def test_default_fallbacks_and_group_aliases(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            model_list:
              - {model_name: a, litellm_params: {model: openai/a, api_base: "http://127.0.0.1:1/v1"}}
              - {model_name: b, litellm_params: {model: openai/b, api_base: "http://127.0.0.1:1/v1"}}
              - {model_name: c, litellm_params: {model: openai/c, api_base: "http://127.0.0.1:1/v1"}}
            router_settings:
              default_fallbacks: [c]
              fallbacks: [{a: [b]}]
              model_group_alias: {gpt-4: a}
            """
        )
    )
    config = load_config(path)

    assert {(f.source, f.to) for f in config.default_policy.fallbacks} == {
        ("a", ("b",)),
        ("b", ("c",)),
    }
    (gpt4,) = config.deployments["gpt-4"]
    assert (gpt4.alias, gpt4.upstream_model) == ("gpt-4", "a")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "litellm_settings:\n  fallbacks: [{a: [gpt-5]}]\n",
            "{path}:4: litellm_settings.fallbacks[0].a[0]: unknown model alias 'gpt-5'; "
            "expected one of: a",
        ),
        (
            "router_settings:\n  context_window_fallbacks: [{nope: [a]}]\n",
            "{path}:4: router_settings.context_window_fallbacks[0].nope: unknown model alias "
            "'nope'; expected one of: a",
        ),
        (
            "general_settings: {master_key: sk-1}\nkeys: {admin_key: sk-2}\n",
            "{path}:3: general_settings.master_key: keys.admin_key is set too ({path}: "
            "keys.admin_key); keep one of them",
        ),
        (
            "general_settings: {master_key: sk-1}\nkeys: {api_keys: [{name: master, key: sk-3}]}\n",
            "{path}:4: keys.api_keys[0].name: API key name 'master' is "
            "general_settings.master_key's",
        ),
        (
            "router_settings: {model_group_alias: {a: a}}\n",
            "{path}:3: router_settings.model_group_alias.a: 'a' is already a model_name; pick "
            "another name",
        ),
        (
            "litellm_settings:\n  fallbacks: [{a: b}]\n",
            "{path}:4: litellm_settings.fallbacks[0].a: 'b' is not of type 'array'",
        ),
        (
            "  - {model_name: '*', litellm_params: {model: 'openai/*'}}\n",
            "{path}:3: model_list[1].litellm_params.model: 'openai/*': wildcard routing is not "
            "supported; list each model by name",
        ),
        (
            "router_settings: {num_retries: -1}\n",
            "{path}:3: router_settings.num_retries: -1 is less than the minimum of 0",
        ),
    ],
)
def test_errors_point_at_the_litellm_setting(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        'model_list:\n  - {model_name: a, litellm_params: {model: openai/a, api_base: "http://127.0.0.1:1/v1"}}\n'
        + extra
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [str(issue) for issue in caught.value.issues] == [message.format(path=path)]


def test_two_chains_of_one_policy_for_the_same_class_are_an_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            model_list:
              - {model_name: a, litellm_params: {model: openai/a, api_base: "http://127.0.0.1:1/v1"}}
              - {model_name: b, litellm_params: {model: openai/b, api_base: "http://127.0.0.1:1/v1"}}
            policies:
              - name: p
                fallbacks:
                  - {from: a, to: [b]}
                  - {from: a, to: [b], when: [overflow, fatal]}
            """
        )
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [str(issue) for issue in caught.value.issues] == [
        f"{path}:8: policies[0].fallbacks[1].from: 'a' already falls back on overflow "
        "(fallbacks[0]); give each chain its own `when`"
    ]


# --- served by a real proxy ----------------------------------------------------------------------


async def test_a_real_proxy_serves_it_as_litellm_would(
    aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    small, mini, large = (Simulator(context_window=w, api_key="sk-sim-upstream-secret")
                          for w in (1000, 8192, 32_000))  # fmt: skip
    urls = [
        str((await aiohttp_server(s.app())).make_url("")).rstrip("/") for s in (small, mini, large)
    ]
    proxy = await start_proxy(litellm_config(tmp_path, *urls))
    hi = [{"role": "user", "content": "hi"}]

    def client(key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=base_url(proxy), api_key=key, max_retries=0)

    # The master key is an API key; no other key is.
    with pytest.raises(openai.AuthenticationError):
        await client("sk-other").chat.completions.create(model="gpt-4o", messages=hi)  # type: ignore[arg-type]
    master = client("sk-1234")
    reply = await master.chat.completions.create(model="gpt-4o", messages=hi)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "You said: hi"
    assert small.requests[-1].body["model"] == "gpt-4o"

    # num_retries: 1 -> two calls in all (the built-in default is three).
    small.inject(Fault(status=503, times=1))
    raw = await master.chat.completions.with_raw_response.create(model="gpt-4o", messages=hi)  # type: ignore[arg-type]
    assert raw.headers["x-agentproxy-model"] == "gpt-4o" and len(small.requests) == 3

    # fallbacks: after its retries, gpt-4o's transient failure goes to gpt-4o-mini.
    small.inject(Fault(status=503, times=2))
    raw = await master.chat.completions.with_raw_response.create(model="gpt-4o", messages=hi)  # type: ignore[arg-type]
    assert raw.headers["x-agentproxy-model"] == "gpt-4o-mini" and len(mini.requests) == 1
    assert len(small.requests) == 5
    assert mini.requests[0].api_key == "sk-sim-upstream-secret"  # environment_variables

    # context_window_fallbacks: an overflow compaction cannot fix goes to gpt-4o-128k.
    question = "Please review this log. " + "line of log output, nothing odd here. " * 300
    raw = await master.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": question}]
    )
    assert raw.headers["x-agentproxy-model"] == "gpt-4o-128k" and len(large.requests) == 1
    assert len(mini.requests) == 1  # not the transient chain

    # The master key opens the admin routes too.
    async with aiohttp.ClientSession() as http:
        admin = str(proxy.make_url("/admin/policies"))
        async with http.get(admin, headers={"Authorization": "Bearer sk-1234"}) as response:
            assert response.status == 200
            shown = await response.json()
    assert any("retry.attempts: 2" in note for note in shown["notes"])
    assert sum("LiteLLM settings with no equivalent" in w for w in shown["warnings"]) == 1


async def test_serve_warns_once_at_start(tmp_path: Path) -> None:
    process, url = await start_serve(litellm_config(tmp_path))
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(
                url + "/v1/models", headers={"Authorization": "Bearer sk-1234"}
            ) as r:
                assert r.status == 200
                models = [m["id"] for m in (await r.json())["data"]]
    finally:
        process.terminate()
        _, raw_stderr = await asyncio.wait_for(process.communicate(), timeout=10)
    stderr = raw_stderr.decode()
    assert models == ["gpt-4o", "gpt-4o-mini", "gpt-4o-128k", "claude-sonnet"]
    assert stderr.count("LiteLLM settings with no equivalent here, not applied") == 1, stderr
    assert "general_settings.store_model_in_db" in stderr
    assert "retry.attempts: 2" in stderr  # the mapping is told at start too
