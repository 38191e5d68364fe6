"""One set of warnings about keys and the bound address, for `serve` and `validate` alike."""

from __future__ import annotations

from dataclasses import replace

import pytest

from proxy.policies.exposure import NO_ADMIN_KEY, NO_API_KEYS, exposure_warnings, is_loopback_host
from proxy.policies.spec import ApiKey, Config, Keys, ServerSettings


def config(host: str, keys: Keys | None = None) -> Config:
    return Config(
        version="v",
        sources=(),
        loaded_at=0.0,
        server=ServerSettings(host=host),
        keys=keys or Keys(),
    )


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.2"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "proxy.internal"])
def test_other_hosts(host: str) -> None:
    assert not is_loopback_host(host)


def test_no_keys_on_a_public_address_warns_about_reverse_proxies() -> None:
    warnings = exposure_warnings(config("0.0.0.0"))
    assert warnings[0] == NO_API_KEYS and warnings[-1] == NO_ADMIN_KEY
    assert "'0.0.0.0' is not a loopback address" in warnings[1]
    assert "reverse proxy" in warnings[1]


def test_the_served_host_overrides_server_host() -> None:
    assert len(exposure_warnings(config("127.0.0.1"))) == 2
    assert len(exposure_warnings(config("127.0.0.1"), host="0.0.0.0")) == 3


def test_keys_silence_the_key_warnings() -> None:
    keys = Keys(api_keys=(ApiKey("a", b"d"),), admin_digest=b"x")
    assert exposure_warnings(config("0.0.0.0", keys)) == []
    assert exposure_warnings(replace(config("0.0.0.0", keys), keys=Keys(admin_digest=b"x"))) == [
        NO_API_KEYS,
        exposure_warnings(config("0.0.0.0"))[1],
    ]
