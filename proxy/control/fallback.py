"""The walk along an alias' fallback chain.

When the requested alias' attempts end in a failure whose class is in a chain's `when` (the
first failure picks the chain: an alias may have one per error class), the aliases of `to` are
tried in order, each with its own retries, each with the client's history
fitted again to its own window (`switch`). Aliases the API key may not use are left out, and
so is an alias whose every deployment is cooling down (its circuit is open). The chain is not
followed further from a fallback (no fallback of a fallback), and never once the request's
deadline has passed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.control.classify import classify
from proxy.exchange import Exchange
from proxy.policies.spec import ErrorClass, FallbackSpec

T = TypeVar("T")


async def with_fallbacks(
    ex: Exchange,
    run: Callable[[], Awaitable[T]],
    switch: Callable[[str, ErrorClass], Awaitable[None]],
    *,
    usable: Callable[[str], bool],
    time_left: Callable[[], bool],
) -> T:
    """`run()` serves `ex.alias` (with its retries); on a failure that triggers the chain,
    `switch(alias, reason)` makes the next alias the exchange's target and it runs again."""
    spec: FallbackSpec | None = None
    chain: list[str] = []
    while True:
        try:
            return await run()
        except Exception as error:
            kind = classify(error, ex.policy.retry.classify)
            if kind is None:
                raise
            if spec is None:  # the first failure's class picks the chain (one per class)
                spec = ex.policy.fallback_for(ex.alias, kind)
                if spec is None:
                    raise
                chain = [a for a in spec.to if a != ex.alias and may_serve(ex, a)]
            if kind not in spec.when or not chain:
                raise
            if ex.dry_run:
                ex.note("fallback", "would_fall_back", to=chain[0], reason=kind)
                raise
            target = _next(ex, chain, usable)
            if target is None or not time_left():
                raise
        await switch(target, kind)


def may_serve(ex: Exchange, alias: str) -> bool:
    """Whether `alias` may serve the request in place of another: configured, and open to
    its key (a budget's downgrade asks too)."""
    models = ex.identity.key.models if ex.identity.key is not None else None
    return alias in ex.config.deployments and (models is None or alias in models)


def _next(ex: Exchange, chain: list[str], usable: Callable[[str], bool]) -> str | None:
    """The next alias of the chain that can take a call now (taken off the chain)."""
    while chain:
        alias = chain.pop(0)
        if usable(alias):
            return alias
        ex.recovery.steps.append(f"skipped {alias} (circuit open)")
    return None
