"""Session affinity: which of an alias' deployments serves a session (`routing.affinity`).

A provider's prompt cache lives with one deployment: a session that moves pays its whole history
again as uncached input. So with `affinity: session` a session's deployments come in an order
of its own, and the first whose circuit is not open serves it:

    its pin        the deployment it moved to last, kept in the session's guard record
                   (store/guard_record.py: scoped by owner, shared by replicas through the store)
    then the rest  ranked by a rendezvous hash of the session key and the deployment key
                   (highest random weight)

The hash needs no shared state: every replica places a session alike without asking another,
new sessions spread evenly, and a deployment added or removed moves only the sessions it gains
or had. (Least-loaded would need load counts shared across replicas, and would move a session
whenever the counts changed, its cache with it.) The session key is scoped by its owner, so a
second key sending the same session id is placed on its own.

A session moves only when its deployment fails (a transient failure: the retry goes to the next
in its order) or its circuit is open; control then re-fits the history to the new deployment as
a fallback does, and once that one answers, the pin records it: the session stays there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import xxhash

from proxy.exchange import Exchange
from proxy.logs.limit import warn_limited
from proxy.policies.spec import Deployment
from proxy.store import guard_record
from proxy.store.base import StoreError
from proxy.store.state import StateStore

log = logging.getLogger("agentproxy.control")
PART = "affinity"  # this part of the session's guard record: {alias: deployment key}

Group = tuple[Deployment, ...]
KeyOf = Callable[[Deployment, Group], str]  # the circuits' deployment key, `alias#index`
Usable = Callable[[Deployment], bool] | None


def applies(ex: Exchange, group: Group) -> bool:
    return len(group) > 1 and ex.policy.routing.affinity == "session"


def ranked(session: str, group: Group, key_of: KeyOf) -> list[Deployment]:
    """The group by rendezvous hash of `session`: the same order on every replica."""
    if len(group) < 2:
        return list(group)
    seed = xxhash.xxh3_64_intdigest(session.encode())

    def weight(deployment: Deployment) -> int:
        return xxhash.xxh3_64_intdigest(key_of(deployment, group).encode(), seed=seed)

    return sorted(group, key=weight)


class Affinity:
    def __init__(self, state: StateStore, key_of: KeyOf) -> None:
        self.state = state
        self.key_of = key_of

    async def load(self, ex: Exchange) -> None:
        """Read the session's guard record (once per request, shared with the guards)."""
        await guard_record.read(self.state, ex)

    def order(self, ex: Exchange, alias: str, group: Group) -> list[Deployment]:
        """The session's deployments of `alias`, best first: its pin, then the hash's order."""
        order = ranked(ex.identity.session, group, self.key_of)
        pinned = _pins(ex).get(alias)
        if pinned is not None:
            for index, deployment in enumerate(order):
                if self.key_of(deployment, group) == pinned:
                    order.insert(0, order.pop(index))
                    break
        return order

    def place(self, ex: Exchange, alias: str, group: Group, usable: Usable) -> Deployment:
        """The first of the session's order that can take a call (the first, if none can)."""
        order = self.order(ex, alias, group)
        if usable is not None:
            return next((d for d in order if usable(d)), order[0])
        return order[0]

    def after(
        self, ex: Exchange, alias: str, group: Group, failed: Deployment, usable: Usable
    ) -> Deployment:
        """The next of the session's order after `failed` that can take a call (wrapping
        round); `failed` itself when no other can."""
        order = self.order(ex, alias, group)
        start = next((i for i, d in enumerate(order) if d is failed), -1)
        for offset in range(1, len(order)):
            candidate = order[(start + offset) % len(order)]
            if usable is None or usable(candidate):
                return candidate
        return failed

    async def settle(self, ex: Exchange, ok: bool) -> None:
        """After a success: the deployment that answered holds the session's cache now. Pinned
        when it is not the hash's first choice, unpinned when it is (no write when unchanged)."""
        deployment = ex.deployment
        if not ok or deployment is None:
            return
        group = ex.config.deployments.get(ex.alias)
        if group is None or not applies(ex, group) or all(d is not deployment for d in group):
            return
        pins = dict(_pins(ex))
        if ranked(ex.identity.session, group, self.key_of)[0] is deployment:
            if pins.pop(ex.alias, None) is None:
                return
        else:
            key = self.key_of(deployment, group)
            if pins.get(ex.alias) == key:
                return
            pins[ex.alias] = key
        try:
            await guard_record.write(self.state, ex, PART, pins or None)
        except StoreError as exc:
            warn_limited(log, "affinity.update", "the deployment of request %s's session not "
                         "recorded: %s", ex.identity.request_id, exc)  # fmt: skip


def _pins(ex: Exchange) -> dict[str, Any]:
    record = ex.guard_record
    pins = record.get(PART) if record is not None else None
    return pins if isinstance(pins, dict) else {}
