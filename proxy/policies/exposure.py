"""What a configuration leaves open to whom: said the same way by `serve` and `validate`."""

from __future__ import annotations

import ipaddress

from proxy.policies.spec import Config

NO_API_KEYS = (
    "!!! no API keys configured (keys.api_keys): serving LOOPBACK CLIENTS ONLY, "
    "without authentication !!!"
)
NO_ADMIN_KEY = (
    "no admin key configured (keys.admin_key): /admin/policies and /admin/reload are "
    "loopback-only, and with API keys every recorded session is its own key's to read only"
)


def exposure_warnings(config: Config, host: str | None = None) -> list[str]:
    """Warnings about keys; `host` is the address bound (default: server.host)."""
    host = config.server.host if host is None else host
    warnings: list[str] = []
    if not config.keys.api_keys:
        warnings.append(NO_API_KEYS)
        if not is_loopback_host(host):
            warnings.append(
                f"server.host {host!r} is not a loopback address, but with no API keys only "
                "loopback clients are served; behind a reverse proxy every client looks like "
                "loopback and is served without a key: set keys.api_keys"
            )
    if config.keys.admin_digest is None:
        warnings.append(NO_ADMIN_KEY)
    return warnings


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname, or "" (every address)
