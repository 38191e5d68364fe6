"""Which session a request belongs to (never a metric label), and whose it is.

The ids clients already send come first: the `x-agentproxy-session` header, Claude Code's
and Codex's session headers, `metadata.session_id` (or the one inside Claude Code's
`metadata.user_id`). Else a fingerprint of the key, the body's `user` (OpenAI's end-user id: it
tells end users apart, never conversations), the system prompt and the first user message,
which stays the same on every turn of one conversation. Conversations that share all of these
are told apart once they diverge (proxy/sessions/lineage.py).

A session id is a name inside one tenant, never a shared handle: every piece of per-session
state is keyed by `scoped(owner, name)`, where the owner is the calling key (or its team, with
`keys.session_scope: team`). Owners never contain "/", so the first "/" splits the two.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash
from cachetools import LRUCache

from proxy.messages import text_of
from proxy.policies.spec import ApiKey, Config, Keys, key_digest

SESSION_HEADER = "x-agentproxy-session"
PARENT_HEADER = "x-agentproxy-parent-session"
# Session ids real agents already send, constant over a conversation (resumes included):
# Claude Code's (also inside its metadata.user_id JSON), Codex's.
CLIENT_SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "thread-id")
MAX_SESSION_CHARS = 128


def _usable(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= MAX_SESSION_CHARS and value.isprintable():
        return value
    return None


@dataclass(frozen=True, slots=True)
class SessionName:
    name: str
    # Sent by the client. A fingerprint (not given) names a family of conversations, which
    # proxy/sessions/lineage.py narrows to the one this request continues.
    given: bool


def session_id(
    headers: Mapping[str, str],
    body: dict[str, Any],
    key_name: str | None,
    opening: Callable[[], list[dict[str, Any]]] | None = None,
) -> SessionName:
    """`opening`: the history up to its first user message, chat-shaped, for a route whose
    body is not (called only when the client names no session)."""
    if given := client_session_id(headers, body):
        return SessionName(given, True)
    user = body.get("user")
    messages = opening() if opening is not None else body.get("messages") or []
    return SessionName(
        fingerprint(messages, key_name, user if isinstance(user, str) else ""), False
    )


def client_session_id(headers: Mapping[str, str], body: dict[str, Any]) -> str | None:
    """The session id the client sent, if any, in the order the design gives."""
    for name in (SESSION_HEADER, *CLIENT_SESSION_HEADERS):
        if given := _usable(headers.get(name)):
            return given
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        return _usable(metadata.get("session_id")) or _in_user_id(metadata.get("user_id"))
    return None


def _in_user_id(user_id: Any) -> str | None:
    """Claude Code's metadata.user_id is JSON carrying its session_id."""
    if not isinstance(user_id, str) or not user_id.startswith("{") or len(user_id) > 4096:
        return None
    try:
        value = orjson.loads(user_id)
    except orjson.JSONDecodeError:
        return None
    return _usable(value.get("session_id")) if isinstance(value, dict) else None


# Per configuration version: its deployments' secrets.
_secrets_of: LRUCache[str, frozenset[str]] = LRUCache(8)


def key_free(name: str, presented: str | None, config: Config) -> str:
    """`name`, a session id the client sent, unless it is a key: the one the client presented,
    a configured API or admin key (or one made at run time), a deployment's secret. A key is
    never a session's name (it would be kept in the store's blobs, the board, the event log
    and the recording): its name is then `key-` and 16 hex digits of its SHA-256, the same for
    every request."""
    secrets = _secrets_of.get(config.version)
    if secrets is None:
        deployments = config.deployments.values()
        secrets = _secrets_of[config.version] = frozenset(
            s for group in deployments for d in group for s in d.secrets()
        )
    keys = config.keys
    if name == presented or name in secrets or _is_client_key(name, keys):
        return "key-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return name


def _is_client_key(name: str, keys: Keys) -> bool:
    if not keys.by_digest and keys.admin_digest is None:
        return False
    digest = key_digest(name)
    return digest in keys.by_digest or digest == keys.admin_digest


def parent_session_id(headers: Mapping[str, str]) -> str | None:
    """A subagent names its parent session so budgets roll its spend up there."""
    return _usable(headers.get(PARENT_HEADER))


def fingerprint(messages: list[dict[str, Any]], key_name: str | None, user: str = "") -> str:
    system = next((m for m in messages if m.get("role") in ("system", "developer")), None)
    first_user = next((m for m in messages if m.get("role") == "user"), None)
    digest = xxhash.xxh3_64()
    for part in (key_name or "", user, text_of(system or {}), text_of(first_user or {})):
        digest.update(part.encode())
        digest.update(b"\0")
    return f"fp-{digest.hexdigest()}"


OPEN_OWNER = "open:"  # no keys configured: every (loopback) client is one tenant


def owner_of(key: ApiKey | None, keys: Keys) -> str:
    """The tenant whose sessions this caller reads and writes."""
    if key is None:
        return OPEN_OWNER
    if keys.session_scope == "team" and key.team:
        return f"team:{key.team}"
    return f"key:{key.name}"


def scoped(owner: str, name: str) -> str:
    """The key of a session's state: unambiguous, as owners hold no "/"."""
    return f"{owner}/{name}"


def name_in_scope(session: str) -> str:
    """The name the client gave, from a scoped session key."""
    return session.partition("/")[2] or session


def may_read(owner: str, key: ApiKey | None, blob_owner: str | None) -> bool:
    """Whether a caller may read a stored blob: its owner's, or (written before sessions were
    scoped, when the owner was the key's name or None) the very key that wrote it."""
    if blob_owner == owner:
        return True
    legacy = key.name if key is not None else None
    return blob_owner == legacy and (blob_owner is None or ":" not in blob_owner)
