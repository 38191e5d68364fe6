"""`replay --session ID`: a recorded session read from the store a proxy is using (SQLite in
WAL mode takes a reader beside the running proxy; Redis any number).

A session id is a name inside one tenant (proxy/sessions/identity.py): with keys configured,
`--key NAME` says whose; without it every owner the configuration has is searched, and a name
that more than one owner uses is refused until --key picks one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from proxy.metrics import Metrics
from proxy.policies.loader import load_config
from proxy.policies.spec import Keys
from proxy.replay.trace import TraceError, check_turns
from proxy.sessions.identity import OPEN_OWNER, owner_of, scoped
from proxy.store.backends import open_backends

ReadTurns = Callable[[Any, str], Awaitable[list[dict[str, Any]]]]


class SessionError(Exception):
    pass


def recording_reader() -> ReadTurns:
    """`recorded_turns(store, session_key)`, imported only when a session is replayed."""
    from proxy.recording.sessions import recorded_turns

    return recorded_turns


def owners(keys: Keys, key_name: str | None) -> dict[str, str | None]:
    """The owners to search, each with the key replay sends as (None: no keys)."""
    if not keys.api_keys:
        if key_name is not None:
            raise SessionError(f"--key {key_name}: the configuration has no keys")
        return {OPEN_OWNER: None}
    named = [k for k in keys.api_keys if key_name is None or k.name == key_name]
    if not named:
        names = ", ".join(k.name for k in keys.api_keys)
        raise SessionError(f"--key {key_name}: no such key; one of {names}")
    found: dict[str, str | None] = {}
    for key in named:
        found.setdefault(owner_of(key, keys), key.name)
    return found


async def session_turns(
    config_path: str, session: str, key_name: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """The session's turns and the key whose session it is."""
    read = recording_reader()
    config = load_config(config_path)
    searched = owners(config.keys, key_name)
    backends = open_backends(config.store, Metrics(), config.keys)
    try:
        found = [
            (owner, key, turns)
            for owner, key in searched.items()
            if (turns := await read(backends.store, scoped(owner, session)))
        ]
    finally:
        await backends.store.close()
        await backends.state.close()
    if not found:
        raise SessionError(f"no recorded session {session!r} (searched: {', '.join(searched)})")
    if len(found) > 1:
        keys = ", ".join(str(key) for _, key, _ in found)
        raise SessionError(f"session {session!r} is recorded for several keys ({keys}): "
                           "choose one with --key")  # fmt: skip
    owner, key, turns = found[0]
    try:
        return check_turns(turns, f"session {session} of {owner}"), key
    except TraceError as exc:
        raise SessionError(str(exc)) from None
