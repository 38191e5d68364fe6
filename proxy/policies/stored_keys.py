"""Keys made at run time (POST /admin/keys) beside the configuration's own.

The store keeps each as a record: its name, team, models, limits, when it was made and last
rotated, and the SHA-256 of its secret (hex) — never the secret. A minted secret is 32 random
bytes: a digest of it cannot be guessed back, so no slow password hash is needed (a slow
KDF guards low-entropy passwords against offline guessing; 2^256 secrets leave nothing to
guess), and the hot path finds a key with one SHA-256 and one dict lookup (`Keys.find`).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

from proxy.policies.spec import ApiKey, Keys, RateLimits

# A recognisable prefix, so a leaked secret is easy to spot (secret scanners, logs), then 32
# random bytes in base64url (43 characters).
SECRET_PREFIX = "sk-ap-"


def mint_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def key_record(key: ApiKey) -> dict[str, Any]:
    """What the store keeps of a run-time key (JSON)."""
    limits = dataclasses.asdict(key.limits) if key.limits is not None else None
    return {
        "name": key.name,
        "digest": key.digest.hex(),
        "team": key.team,
        "models": sorted(key.models) if key.models is not None else None,
        "limits": {k: v for k, v in (limits or {}).items() if v is not None} or None,
        "created_at": key.created_at,
        "rotated_at": key.rotated_at,
    }


def key_of(record: Mapping[str, Any]) -> ApiKey:
    limits = record.get("limits")
    models = record.get("models")
    return ApiKey(
        name=record["name"],
        digest=bytes.fromhex(record["digest"]),
        team=record.get("team"),
        models=frozenset(models) if models is not None else None,
        limits=RateLimits(**limits) if limits else None,
        source="store",
        created_at=record.get("created_at"),
        rotated_at=record.get("rotated_at"),
    )


def merged_keys(configured: Keys, stored: Iterable[ApiKey]) -> tuple[Keys, tuple[str, ...]]:
    """The configuration's keys and the stored ones; a stored key named as a configured one
    is left out (the YAML wins), and its name returned to be said."""
    names = {key.name for key in configured.api_keys}
    kept: list[ApiKey] = []
    clashes: list[str] = []
    for key in stored:
        if key.name in names:
            clashes.append(key.name)
        elif key.digest not in configured.by_digest and key.digest != configured.admin_digest:
            kept.append(key)
    if not kept:
        return configured, tuple(clashes)
    merged = Keys(
        api_keys=(*configured.api_keys, *kept),
        admin_digest=configured.admin_digest,
        session_scope=configured.session_scope,
    )
    return merged, tuple(clashes)


def describe_key(key: ApiKey) -> dict[str, Any]:
    """A key as GET /admin/keys lists it: never its secret nor its digest."""
    record = key_record(key)
    del record["digest"]
    return {**record, "source": key.source}
