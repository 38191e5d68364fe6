"""Parts of the proxy that bench/cpu.py can turn off (`--without`), to price each one.

Each part is stubbed in this process only, on the proxy's classes, before its app is built: the
requests still go through, nothing is rewritten, guarded or counted. What a part costs is the
proxy's CPU per request with it minus without it, in the same run; with every part off, what
is left is the request's shell (auth, body limits, the exchange, control's layers, the upstream
client's limits, the answer's headers) against the bare forwarder's. Never used by the proxy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class _Idle:
    """A metric child that counts nothing."""

    def inc(self, *_: Any) -> None: ...

    def dec(self, *_: Any) -> None: ...

    def observe(self, *_: Any) -> None: ...

    def set(self, *_: Any) -> None: ...


async def _nothing_async(*_: Any, **__: Any) -> None:
    return None


def _nothing(*_: Any, **__: Any) -> None:
    return None


def _no_labels(self: Any, metric: Any, *labels: str) -> _Idle:
    return _IDLE


_IDLE = _Idle()

# part -> the (module, class or None, attribute) it replaces, and with what
PARTS: dict[str, list[tuple[str, str | None, str, Callable[..., Any]]]] = {
    "metrics": [  # every counter and histogram
        ("proxy.metrics", "Metrics", "child", _no_labels),
        ("prometheus_client.values", "MutexValue", "inc", _nothing),
    ],
    "lineage": [("proxy.sessions.lineage", "Lineage", "resolve", _nothing_async)],  # which branch
    "rewrites": [  # the history chain: repair, offload, compaction, loops, budgets
        ("proxy.pipeline.rewriter", "Rewriter", "before_call", _nothing_async),
        ("proxy.pipeline.rewriter", "Rewriter", "after_call", _nothing_async),
        ("proxy.pipeline.rewriter", "Rewriter", "accepted", _nothing),
    ],
    "guards": [  # circuits' and budgets' admission, and settling
        ("proxy.control.control", "Control", "admit", _nothing_async),
        ("proxy.control.control", "Control", "settle", _nothing_async),
    ],
    "activity": [  # sessions' activity, for the store's retention
        ("proxy.store.activity", "Activity", "arrive", _nothing),
        ("proxy.store.activity", "Activity", "leave", _nothing),
    ],
    "charging": [("proxy.flow", "Flow", "finish", _nothing_async)],  # usage, cost, budgets
    "accounting": [("proxy.http.middleware", None, "_account", _nothing)],  # per-request counters
}


def turn_off(names: str) -> list[str]:
    """Stub the named parts (comma-separated; `all` for every one); the names turned off. A
    part whose target moved stops the run rather than stubbing nothing."""
    chosen = list(PARTS) if names == "all" else [n for n in names.split(",") if n]
    unknown = [n for n in chosen if n not in PARTS]
    if unknown:
        raise SystemExit(f"--without: unknown part(s) {unknown}; parts: {', '.join(PARTS)}, all")
    for name in chosen:
        for module, holder, attribute, stub in PARTS[name]:
            target: Any = importlib.import_module(module)
            if holder is not None:
                target = getattr(target, holder)
            if not hasattr(target, attribute):
                where = ".".join(part for part in (module, holder, attribute) if part)
                raise SystemExit(f"--without {name}: {where} is gone")
            setattr(target, attribute, stub)
    return chosen
