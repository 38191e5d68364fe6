"""Each owner's share of the store: one tenant filling it stops only itself.

The size cap (`store.max_mb`) is shared by every key (or team, with `keys.session_scope:
team`). Without shares one tenant sending large tool results fills it with sessions that are
all live, and from then on every tenant's offloads are refused. So each owner may hold at most
`store.max_owner_share` of the cap. A write that would take its owner past that first evicts
the owner's own sessions that are not live, least recently active first (down to LOW_WATER of
the share); only if that is not enough is it refused (OwnerFull), and what it would have
stored stays in the request, as at the cap. Other owners' data is never touched for it.

Each backend keeps the bytes per owner as it keeps the bytes per session (incrementally, on
every write and deletion) and checks the share in the same transaction or script as the
write: no scan per write, and replicas sharing a Redis see one count.
"""

from __future__ import annotations

from proxy.policies.spec import Keys, StoreSettings
from proxy.sessions.identity import OPEN_OWNER, owner_of
from proxy.store.retention import StoreFull

# With many owners an equal split would leave each too little; no share goes below this.
MIN_AUTO_SHARE = 0.1


class OwnerFull(StoreFull):
    """One owner holds its whole share with live sessions only: its write is refused, and
    nobody else's is."""


def owner_share(settings: StoreSettings, keys: Keys) -> float | None:
    """The share of the cap one owner may hold; None when there is no limit to keep (no cap,
    or a single owner). Unset, an equal split between the configured owners, at least
    MIN_AUTO_SHARE: two keys get half each, ten or more a tenth."""
    if settings.max_mb is None:
        return None
    owners = {owner_of(key, keys) for key in keys.api_keys} or {OPEN_OWNER}
    share = settings.max_owner_share
    if share is None:
        share = 1.0 if len(owners) <= 1 else max(MIN_AUTO_SHARE, 1.0 / len(owners))
    return None if share >= 1.0 else share


def session_owner(session: str) -> str:
    """The owner a scoped session key (proxy/sessions/identity.py `scoped`) belongs to; "" for a key
    written before sessions were scoped, which no share limits."""
    owner, slash, _ = session.partition("/")
    return owner if slash else ""


def owner_full_message(where: str, owner: str, limit: int) -> str:
    return (
        f"{where}: {owner} holds its share of store.max_mb ({limit:,} bytes, "
        "store.max_owner_share) with only live sessions of its own left: not written, "
        "kept in the context"
    )
