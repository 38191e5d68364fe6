"""What a reload changed, by name: the audit's summary of a configuration change."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from proxy.policies.spec import Config


def config_diff(old: Config, new: Config) -> dict[str, Any]:
    """Which policies, aliases and keys were added, removed or changed (names only: a key's
    secret or digest never appears), and whether the server settings changed."""
    configured = [key for key in old.keys.api_keys if key.source == "yaml"]
    now_configured = [key for key in new.keys.api_keys if key.source == "yaml"]
    return {
        "policies": _named({p.name: p for p in old.policies}, {p.name: p for p in new.policies}),
        "aliases": _named(_placeless(old), _placeless(new)),
        "keys": _named({k.name: k for k in configured}, {k.name: k for k in now_configured}),
        "admin_key_changed": old.keys.admin_digest != new.keys.admin_digest,
        "server_changed": old.server != new.server,
    }


def _placeless(config: Config) -> dict[str, Any]:
    """The deployments without where they were written: moving an entry changes nothing."""
    return {
        alias: tuple(dataclasses.replace(d, source="") for d in group)
        for alias, group in config.deployments.items()
    }


def _named(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list[str]]:
    return {
        "added": sorted(set(new) - set(old)),
        "removed": sorted(set(old) - set(new)),
        "changed": sorted(name for name in set(old) & set(new) if old[name] != new[name]),
    }
