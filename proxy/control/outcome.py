"""The errors control raises itself, and what every failure it hands back carries.

Every failure that leaves control has `x-should-retry: false` (the openai and anthropic SDKs
then do not retry what the proxy already retried) and, in its body's error object: `class`,
`attempts` (upstream calls made), `upstream_status` (of the last one), `recoveries` (what was
tried, in order) and `guidance` when there is some. One exception: a provider's error on the
very first call, with nothing tried, passes through with its body unchanged.
"""

from __future__ import annotations

import math

from proxy.errors import ProxyError
from proxy.exchange import Exchange
from proxy.policies.spec import ErrorClass
from proxy.store.retention import StoreFull
from proxy.store.shares import OwnerFull
from proxy.upstream.base import UpstreamHTTPError

NO_RETRY = {"x-should-retry": "false"}


class CircuitOpen(ProxyError):
    """Every deployment of an alias is cooling down: the alias fails without an upstream call
    (and its fallback, if any, is tried)."""

    status = 503
    type = "service_unavailable"
    code = "circuit_open"

    def __init__(self, alias: str, failures: int, retry_in_s: float) -> None:
        wait = max(retry_in_s, 0.0)
        super().__init__(
            f"every deployment of '{alias}' is cooling down after {failures} consecutive "
            f"failures (circuit open); the next probe goes through in {wait:.1f}s",
            headers={**NO_RETRY, "retry-after": str(max(1, math.ceil(wait)))},
        )
        self.retry_in_s = wait


class SessionCircuitOpen(ProxyError):
    """A session whose calls kept failing sent the same request again."""

    status = 429
    type = "session_circuit_open"
    code = "session_circuit_open"

    def __init__(self, session: str, failures: int, last_status: int | None) -> None:
        last = f" (the last one HTTP {last_status})" if last_status else ""
        super().__init__(
            f"session '{session}' failed {failures} times in a row{last} and sent the same "
            "request again; the proxy will not forward it until the request changes: fix what "
            "the previous error said, or send a different last message",
            headers=dict(NO_RETRY),
        )
        self.extra.update(failures=failures, upstream_status=last_status)


def failure_fields(ex: Exchange) -> dict[str, object]:
    recovery = ex.recovery
    fields: dict[str, object] = {
        "class": recovery.last_class,
        "attempts": recovery.calls,
        "upstream_status": recovery.last_status,
        "recoveries": recovery.recoveries(),
    }
    if recovery.guidance:
        fields["guidance"] = recovery.guidance
    return fields


def decorate(error: BaseException, ex: Exchange, kind: ErrorClass | None = None) -> None:
    """Mark a failure control gives up on, for the client and its SDK."""
    store_failure = offload_store_failure(ex) if kind == "overflow" else None
    if isinstance(error, ProxyError):
        error.headers.update(NO_RETRY)
        error.extra.update(failure_fields(ex))
    elif isinstance(error, UpstreamHTTPError):
        error.headers.update(NO_RETRY)
        recovery = ex.recovery
        if recovery.calls > 1 or recovery.steps or recovery.guidance or store_failure:
            error.extra.update(failure_fields(ex), request_id=ex.identity.request_id)
    if store_failure is not None and isinstance(error, ProxyError | UpstreamHTTPError):
        error.extra.update(store_failure)


def offload_store_failure(ex: Exchange) -> dict[str, object] | None:
    """When offloading failed for want of a store, an overflow is the store's fault, not the
    client's: the fields that say so (None when every offload was stored)."""
    failures = [
        note.fields
        for note in ex.notes
        if note.stage == "offload" and note.action == "store_failed"
    ]
    if not failures:
        return None
    failed = sum(int(fields.get("count", 1)) for fields in failures)
    # archive.py records each failure as "ErrorType: message".
    errors = [str(fields.get("error", "")) for fields in failures]
    if any(error.startswith(OwnerFull.__name__) for error in errors):
        cause = (
            "share for this key (or team) is full (store.max_owner_share of store.max_mb) "
            "with only its own live sessions left"
        )
        remedy = (
            "retry once some of this key's sessions have gone idle (store.live_s), or ask the "
            "proxy's operator to raise store.max_owner_share or store.max_mb; other keys are "
            "not affected"
        )
    elif any(error.startswith(StoreFull.__name__) for error in errors):
        cause = "is full (store.max_mb) with only live sessions left"
        remedy = (
            "the proxy's operator should raise store.max_mb or lower store.live_s (see "
            "docs/configuration.md); retry once sessions have gone idle"
        )
    else:
        cause = "is unavailable or read-only"
        remedy = (
            "retry once the proxy's store is back (its /readyz says so), or send smaller tool "
            "results meanwhile"
        )
    return {
        "store_error": (
            f"offloading failed because the proxy's store {cause}: {failed} large tool "
            "result(s) could not be stored, so they stayed in the context"
        ),
        "guidance": (
            "the context overflowed because the proxy could not offload; this is not the "
            f"request's fault: {remedy}"
        ),
    }
