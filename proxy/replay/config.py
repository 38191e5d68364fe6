"""The configuration a replay serves with: every deployment answered by the replay's upstream
on loopback, its own store in a scratch folder, keys with secrets the replay knows.

Without --config it is the demo's (`agentproxy demo`): the policy `demo` (offload above 500
tokens) for every request and `default` (the built-in defaults) by name, each model the trace
names a deployment of its wire's provider with the demo's 8,192-token window, priced from
litellm's price map when it knows the name. With --config, the configuration as it is, but
pointed at the replay's upstream, its fallback policy also chosen by name (`default`);
`--live ALIAS`: that alias keeps its real deployment and summarizes for every policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from proxy.policies.loader import load_config, load_document
from proxy.policies.spec import Config, Deployment, Keys, Policy, PolicyMatch, key_digest
from proxy.wire.registry import WIRES

SUMMARIZER = "replay-summarizer"
DEMO_WINDOW = 8192  # the demo's model window (proxy/sim/demo.py)
_PROVIDER = {wire.name: wire.provider for wire in WIRES}  # a trace's model: its wire's provider
_SUMMARIZER_PROVIDER = "openai"  # summaries are chat requests


class ReplayConfigError(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class Served:
    config: Config
    secret: str | None  # what the replay sends as its key (None: the config has no keys)
    key_name: str | None


def built_in(turns: Sequence[dict[str, Any]], upstream: str, store: str) -> dict[str, Any]:
    models: dict[str, str] = {}
    for turn in turns:
        models.setdefault(turn["request"]["model"], _PROVIDER[turn["wire"]])
    model_list = [
        _entry(name, provider, upstream, DEMO_WINDOW) for name, provider in models.items()
    ]
    model_list.append(_entry(SUMMARIZER, _SUMMARIZER_PROVIDER, upstream, 128_000))
    summarizer = {"summarizer_model": SUMMARIZER}
    return {
        "store": {"path": store},
        "model_list": model_list,
        "policies": [
            {
                "name": "demo",
                "description": "agentproxy demo's policy: offload tool results above 500 tokens",
                "offload": {"min_tokens": 500, "preview_lines": 3},
                "compaction": summarizer,
            },
            {"name": "default", "description": "the built-in defaults", "compaction": summarizer},
        ],
    }


def _entry(name: str, provider: str, upstream: str, window: int) -> dict[str, Any]:
    base = _base(provider, upstream)
    return {
        "model_name": name,
        "litellm_params": {"model": f"{provider}/{name}", "api_base": base, "api_key": "replay"},
        "model_info": {"max_input_tokens": window},
    }


def _base(provider: str, upstream: str) -> str:
    """The simulator's root for a provider: Anthropic's paths start there, the others' at
    /v1 (Google's `/v1/models/{model}:generateContent` among them)."""
    return upstream if provider == "anthropic" else f"{upstream}/v1"


def replay_config(
    turns: Sequence[dict[str, Any]],
    config_path: str | None,
    upstream: str,
    store: str,
    *,
    key_name: str | None = None,
    live: str | None = None,
) -> Served:
    """Raises ConfigError (the file) or ReplayConfigError (the flags)."""
    if config_path is None:
        if key_name is not None:
            raise ReplayConfigError("--key needs --config: the built-in configuration has no keys")
        if live is not None:
            raise ReplayConfigError("--live needs --config: it names the summarizer's alias there")
        return Served(load_document("replay", built_in(turns, upstream, store)), None, None)
    config = load_config(config_path)
    if live is not None and live not in config.deployments:
        raise ReplayConfigError(f"--live {live}: no such alias in {config_path}")
    deployments = {
        alias: group if alias == live else tuple(_pointed(d, upstream) for d in group)
        for alias, group in config.deployments.items()
    }
    keys, secret, chosen = _known_keys(config.keys, key_name)
    default = _summarized_by(config.default_policy, live)
    named = _default_by_name(config.policies, default, keys)
    policies = tuple(_summarized_by(p, live) for p in named)
    config = dataclasses.replace(
        config,
        deployments=deployments,
        policies=policies,
        default_policy=default,
        keys=keys,
        store=dataclasses.replace(config.store, backend="local", path=store, event_log=None),
    )
    return Served(config, secret, chosen)


def _default_by_name(policies: Sequence[Policy], default: Policy, keys: Keys) -> list[Policy]:
    """The policies, and last the one no match selects under its name (`default`) unless an
    entry has that name: `--policy default` and `--against default` name it with a config as
    without. Open to every key (a header may choose it), and selected only where the
    fallback would be, so the configuration's choices are otherwise unchanged."""
    if any(p.name == default.name for p in policies):
        return list(policies)
    every_key = frozenset(k.name for k in keys.api_keys) if keys.api_keys else None
    return [*policies, dataclasses.replace(default, match=PolicyMatch(keys=every_key))]


def _pointed(deployment: Deployment, upstream: str) -> Deployment:
    """The deployment answered by the replay's upstream: a provider some wire speaks
    natively (Anthropic's, Google's) as itself, any other as an OpenAI-compatible server (its
    alias, window and prices as configured)."""
    native = deployment.provider in _PROVIDER.values()
    provider = deployment.provider if native else _SUMMARIZER_PROVIDER
    return dataclasses.replace(
        deployment,
        model=f"{provider}/{deployment.upstream_model}",
        provider=provider,
        api_base=_base(provider, upstream),
        api_key="replay",
        extra_headers={},
        litellm_params={"model": f"{provider}/{deployment.upstream_model}"},
    )


def _summarized_by(policy: Any, live: str | None) -> Any:
    if live is None:
        return policy
    return dataclasses.replace(
        policy, compaction=dataclasses.replace(policy.compaction, summarizer_model=live)
    )


def _known_keys(keys: Keys, key_name: str | None) -> tuple[Keys, str | None, str | None]:
    """The configured keys with secrets the replay knows, and the one it sends: --key NAME,
    else the first configured key."""
    if not keys.api_keys:
        if key_name is not None:
            raise ReplayConfigError(f"--key {key_name}: the configuration has no keys")
        return dataclasses.replace(keys, admin_digest=None), None, None
    names = [key.name for key in keys.api_keys]
    chosen = key_name or names[0]
    if chosen not in names:
        raise ReplayConfigError(f"--key {chosen}: no such key; one of {', '.join(names)}")
    known = tuple(
        dataclasses.replace(key, digest=key_digest(_secret(key.name))) for key in keys.api_keys
    )
    return dataclasses.replace(keys, api_keys=known, admin_digest=None), _secret(chosen), chosen


def _secret(name: str) -> str:
    return f"replay-key-{name}"
