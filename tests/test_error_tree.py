"""One base for every error a client is answered with, one status per error class."""

from __future__ import annotations

from aiohttp import web

from proxy.errors import Failure, ProxyError, from_http_exception, status_of
from proxy.upstream.base import UpstreamHTTPError


def test_a_providers_error_and_the_proxys_own_share_one_base() -> None:
    provider = UpstreamHTTPError(429, b"{}", {})
    assert isinstance(provider, Failure) and not isinstance(provider, ProxyError)
    assert status_of(provider) == 429
    assert status_of(ValueError("a bug")) == 500


def test_an_aiohttp_refusal_maps_to_one_class_per_status() -> None:
    first = from_http_exception(web.HTTPLengthRequired())
    again = from_http_exception(web.HTTPLengthRequired())
    assert type(first) is type(again) and first.status == type(first).status == 411
    assert first.body(None)["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert status_of(from_http_exception(web.HTTPNotImplemented())) == 501
