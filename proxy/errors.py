"""The proxy's error tree, under one base (`Failure`): each error class maps to exactly one HTTP
status and error type (`status_of` reads it); each wire renders the shape (proxy/wire/base.py:
Wire.error_body, OpenAI's envelope by default), and `error_response` is the single place that
turns a proxy error into a response.

Two branches: `ProxyError`, what the proxy itself refuses or fails with (its body is the
proxy's), and the provider's own error answer (proxy/upstream/base.py: UpstreamHTTPError,
whose status and body are the provider's and pass through)."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from aiohttp import web


class Failure(Exception):
    """Every error a client is answered with."""

    status = 500


def status_of(error: BaseException) -> int:
    """The HTTP status a failure stands for (500: anything that is not one, a bug)."""
    return error.status if isinstance(error, Failure) else 500


class ProxyError(Failure):
    status = 500
    type = "internal_error"
    code: str | None = None
    closes_connection = False  # answer, then hang up: what the client sends next is not read
    # Raised before the request left for the provider (refused or untranslatable): the
    # upstream did not fail, so agentproxy_upstream_errors_total does not count it.
    unsent = False

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = dict(headers or {})
        # More fields for the body's error object (what recovery tried, for instance).
        self.extra: dict[str, object] = {}

    def body(self, request_id: str | None) -> dict[str, object]:
        error: dict[str, object] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        if request_id:
            error["request_id"] = request_id
        if self.extra:
            error.update(self.extra)
        return {"error": error}


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(ProxyError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(ProxyError):
    status = 403
    type = "permission_error"


class NotFound(ProxyError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class Conflict(ProxyError):
    """What was asked clashes with what exists (a key of that name; a key only the
    configuration's files can change)."""

    status = 409
    type = "invalid_request_error"
    code = "conflict"


class MethodNotAllowed(ProxyError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class UnsupportedMediaType(ProxyError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class RequestTimeout(ProxyError):
    """The client stopped sending its body; the connection is closed after the answer."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"
    closes_connection = True


class UpgradeRequired(ProxyError):
    status = 426
    type = "invalid_request_error"


class PayloadTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UpstreamUnreachable(ProxyError):
    """No usable answer: connection refused or reset, or a body that is not what it claims."""

    status = 502
    type = "upstream_error"
    code = "upstream_unreachable"


class UpstreamBadResponse(UpstreamUnreachable):
    code = "upstream_bad_response"


class UpstreamTooLarge(UpstreamBadResponse):
    """A body or event over its cap (server.max_response_bytes, server.max_event_bytes). Not
    retried: the same request would draw the same answer, and be billed for it again."""


class UpstreamTimeout(ProxyError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


class ServiceUnavailable(ProxyError):
    status = 503
    type = "service_unavailable"
    code = "not_ready"


class StoreUnavailable(ServiceUnavailable):
    """What was asked is kept in the store, which did not answer."""

    code = "store_unavailable"


class Overloaded(ServiceUnavailable):
    code = "overloaded"


class InternalError(ProxyError):
    """A bug in the proxy: still an OpenAI-style body, never a bare 500."""


def error_response(
    error: ProxyError,
    request_id: str | None,
    extra_headers: Mapping[str, str] | None = None,
    *,
    body: Mapping[str, object] | None = None,
) -> web.Response:
    """`body` is the error in the client's wire format when it is not OpenAI's."""
    headers = {**error.headers, **(extra_headers or {})}
    return web.Response(
        status=error.status,
        body=_dumps(body if body is not None else error.body(request_id)),
        content_type="application/json",
        headers=headers,
    )


def _dumps(body: Mapping[str, object]) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:
        # A message quoting a header sent with bytes that are not UTF-8 (aiohttp keeps them as
        # lone surrogates, which JSON cannot carry): the error must still go out.
        return orjson.dumps(_valid_text(body))


def _valid_text(value: object) -> object:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, Mapping):
        return {str(_valid_text(k)): _valid_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_valid_text(v) for v in value]
    return value


_HTTP_ERRORS: dict[int, type[ProxyError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    413: PayloadTooLarge,
}


def from_http_exception(exc: web.HTTPException) -> ProxyError:
    """aiohttp's own errors (unknown route, wrong method, ...) in our shape."""
    kind = _HTTP_ERRORS.get(exc.status)
    if kind is not None:
        return kind(exc.reason or exc.text or "request rejected")
    return _refusal(exc.status)(exc.reason or "request rejected")


def _refusal(status: int) -> type[ProxyError]:
    """One error class per other status aiohttp answers with (made once each), so an error
    still maps to exactly one status."""
    kind = _HTTP_ERRORS.get(status)
    if kind is None:
        error_type = "invalid_request_error" if status < 500 else "internal_error"
        attributes = {"status": status, "type": error_type}
        kind = _HTTP_ERRORS[status] = type(f"HTTP{status}", (ProxyError,), attributes)
    return kind
