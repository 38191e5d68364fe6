"""Rate limits in the configuration: one `limits` type on a key and per scope in a policy,
validated by the schema, with every problem named by its YAML path and line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from proxy.policies.loader import ConfigError, load_config
from proxy.policies.spec import PolicyLimits, RateLimits

BASE = """\
model_list:
  - model_name: m
    litellm_params: {model: openai/m, api_base: "http://127.0.0.1:9/v1", api_key: k}
"""


def load(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(BASE + textwrap.dedent(extra))
    return path


def test_limits_on_a_key_and_per_scope_in_a_policy(tmp_path: Path) -> None:
    config = load_config(
        load(
            tmp_path,
            """\
            keys:
              api_keys:
                - {name: a, key: sk-a, limits: {rpm: 5, tpm: 1000, max_concurrent: 2}}
                - {name: b, key: sk-b}
            policies:
              - name: p
                limits:
                  session: {max_concurrent: 1}
                  global: {rpm: 100, on_store_error: refuse}
            """,
        )
    )
    a, b = config.keys.api_keys
    assert a.limits == RateLimits(rpm=5, tpm=1000, max_concurrent=2)
    assert b.limits is None
    limits = config.policies[0].limits
    assert limits == PolicyLimits(
        session=RateLimits(max_concurrent=1),
        global_=RateLimits(rpm=100, on_store_error="refuse"),
    )
    assert [scope for scope, _ in limits.scopes] == ["session", "global"]
    assert config.default_policy.limits.scopes == ()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            "keys:\n  api_keys:\n    - {name: a, key: sk-a, limits: {rpm: 0}}\n",
            ":6: keys.api_keys[0].limits.rpm: 0 is less than the minimum of 1",
        ),
        (
            "keys:\n  api_keys:\n    - {name: a, key: sk-a, limits: {rpm: 1.5}}\n",
            ":6: keys.api_keys[0].limits.rpm: 1.5 is not of type 'integer'",
        ),
        (
            "keys:\n  api_keys:\n    - {name: a, key: sk-a, limits: {on_store_error: refuse}}\n",
            ":6: keys.api_keys[0].limits: needs at least one limit: rpm, tpm or max_concurrent",
        ),
        (
            "policies:\n  - name: p\n    limits:\n      keys: {rpm: 3}\n",
            ":7: policies[0].limits.keys: unknown key 'keys'; did you mean 'key'?",
        ),
        (
            "policies:\n  - name: p\n    limits:\n      team: {rps: 3}\n",
            ":7: policies[0].limits.team.rps: unknown key 'rps'; did you mean 'rpm'?",
        ),
        (
            "policies:\n  - name: p\n    limits: {global: {tpm: 10, on_store_error: deny}}\n",
            "policies[0].limits.global.on_store_error: 'deny' is not one of ['allow', 'refuse']",
        ),
    ],
)
def test_a_bad_limits_block_is_named_by_its_yaml_path(
    tmp_path: Path, extra: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(load(tmp_path, extra))
    assert expected in str(caught.value), str(caught.value)
