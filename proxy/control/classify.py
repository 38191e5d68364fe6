"""One table maps every upstream outcome to a class; a policy may override it per status.

- transient: worth retrying (408, 429, 500, 502, 503, 504, 529 and other 5xx; connection
  refused or reset, read timeout, a garbled body; every deployment's circuit open)
- overflow: the provider says the context is exceeded (handed to reactive compaction)
- logical: retrying cannot help (400, 401, 403, 404, 422 and every other 4xx; 501, 505; a 5xx
  whose body is a validation error of the request, as llama-cpp-python answers a field it does
  not accept; an upstream body or event over the proxy's size cap, which the same request would
  draw again)
- fatal: the proxy's own resources are exhausted (memory, file descriptors, disk)

Anything else raised on the way is a bug in the proxy: no class, never retried.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping

from proxy.control.outcome import CircuitOpen
from proxy.errors import UpstreamTimeout, UpstreamTooLarge, UpstreamUnreachable
from proxy.policies.spec import ErrorClass
from proxy.upstream.base import UpstreamHTTPError
from proxy.upstream.overflow import is_context_overflow

TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})
LOGICAL_5XX = frozenset({501, 505})  # not implemented, version not supported
# Statuses that say the deployment itself is unwell, whatever was asked: a plain 500 (or
# another 5xx) may instead be one request the server cannot handle, and a 408 or 504 (like the
# proxy's own timeouts) one request too big to answer in time.
DEPLOYMENT_STATUSES = frozenset({429, 502, 503, 529})
SLOW_STATUSES = frozenset({408, 504})
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.ENOSPC})

NO_OVERRIDES: Mapping[int, ErrorClass] = {}
# Lower-case fragments of an error body that blames the request's shape, not the server:
# pydantic's and FastAPI's validation errors (what Python model servers answer, some with a
# 500), and OpenAI's error type for a bad request.
VALIDATION_TEXTS = (
    "validation error",
    "validationerror",
    "input should be",
    "field required",
    "invalid_request_error",
)
SCAN_BYTES = 64 * 1024  # error bodies are small; never lower-case a megabyte of HTML


def classify(
    error: BaseException, overrides: Mapping[int, ErrorClass] = NO_OVERRIDES
) -> ErrorClass | None:
    """The class of a failed upstream call; None for an exception that is not an outcome of
    one (a bug: it is never retried and reaches the client as a 500)."""
    if isinstance(error, UpstreamHTTPError):
        return classify_status(error.status, error.body, overrides)
    if isinstance(error, UpstreamTooLarge):
        return "logical"
    # UpstreamBadResponse (garbled) is an UpstreamUnreachable.
    if isinstance(error, UpstreamUnreachable | UpstreamTimeout | CircuitOpen):
        return "transient"
    if isinstance(error, MemoryError):
        return "fatal"
    if isinstance(error, OSError) and error.errno in RESOURCE_ERRNOS:
        return "fatal"
    return None


def classify_status(status: int, body: bytes, overrides: Mapping[int, ErrorClass]) -> ErrorClass:
    """A provider's "context exceeded" is recognised by its text first, whatever its status;
    then the policy's `retry.classify`, then the table."""
    if is_context_overflow(status, body):
        return "overflow"
    override = overrides.get(status)
    if override is not None:
        return override
    if status >= 500 and is_request_invalid(body):
        return "logical"  # the same request would be refused again
    if status in TRANSIENT_STATUSES:
        return "transient"
    if status >= 500 and status not in LOGICAL_5XX:
        return "transient"
    return "logical"


def is_request_invalid(body: bytes) -> bool:
    """Whether an error body says the request itself is malformed (so a retry cannot help)."""
    text = body[:SCAN_BYTES].decode("utf-8", "replace").lower()
    return any(fragment in text for fragment in VALIDATION_TEXTS)


def blames_deployment(error: BaseException) -> bool:
    """Whether a transient failure is the deployment's (unreachable, overloaded, rate limited),
    not possibly the one request's: only the former count per call toward its circuit. A
    timeout is not: a client can make any provider slow with a huge prompt or `max_tokens`."""
    if isinstance(error, UpstreamHTTPError):
        return error.status in DEPLOYMENT_STATUSES
    return not isinstance(error, UpstreamTimeout)


def is_slow(error: BaseException) -> bool:
    """A timeout: the proxy's own, or a 408 or 504 from the provider or its gateway."""
    if isinstance(error, UpstreamHTTPError):
        return error.status in SLOW_STATUSES
    return isinstance(error, UpstreamTimeout)
