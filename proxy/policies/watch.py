"""Holds the active Config and replaces it on file edits, SIGHUP or an admin request.

The swap is one reference assignment: a request keeps the Config it read at its start. A
configuration that fails to load never replaces the active one; the failure is logged, counted
and kept for /admin/policies. Two more never do: files still being written (a reload waits
until their contents stay the same for `server.reload_settle_s`, and loads them only if they
did not change while read), and one that would remove authentication (dropping every key
takes a restart, never a half-written file or a slip in an edit).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.logs.lines import log_lines
from proxy.metrics import Metrics
from proxy.policies.loader import (
    ConfigError,
    ConfigIssue,
    config_sources,
    load_config,
    sources_fingerprint,
)
from proxy.policies.spec import ApiKey, Config
from proxy.policies.stored_keys import merged_keys

log = logging.getLogger("agentproxy.config")

# A file rewritten for longer than this many settle intervals is reported, not waited for: the
# watcher tries again at its next change.
MAX_SETTLE_ROUNDS = 10


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    ok: bool
    trigger: str  # "watch", "sighup", "admin"
    at: float
    version: str
    errors: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "trigger": self.trigger,
            "at": self.at,
            "version": self.version,
            "errors": list(self.errors),
        }


# Told of every reload, applied or refused: the outcome, the configuration before, the one
# applied (None when refused) and who asked (an admin request's caller, or None).
ReloadListener = Callable[[ReloadOutcome, Config, Config | None, Mapping[str, str] | None], None]


class ConfigHolder:
    """`current` is the configuration the files make with the keys made at run time added
    (`use_stored_keys`); `loaded`, the files' alone."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None,  # None: given on the command line, no file
        config: Config,
        metrics: Metrics,
    ) -> None:
        self.path = path
        self.loaded = config
        self.current = config
        self._stored: tuple[ApiKey, ...] = ()
        self._clashes: set[str] = set()  # stored keys a YAML key's name hides, said once
        self._reload_listeners: list[ReloadListener] = []
        self.last_reload: ReloadOutcome | None = None
        self._metrics = metrics
        self._listeners: list[Callable[[Config], None]] = []
        self._lock = asyncio.Lock()
        self._fingerprint = _fingerprint(path)
        metrics.set_config_version(config.version, config.loaded_at)
        metrics.config_last_reload_ok.set(1)

    def on_change(self, listener: Callable[[Config], None]) -> None:
        self._listeners.append(listener)

    def on_reload(self, listener: ReloadListener) -> None:
        self._reload_listeners.append(listener)

    def use_stored_keys(self, stored: Iterable[ApiKey]) -> None:
        """The keys made at run time, as the store holds them now: merged into `current`
        (one reference swap; the YAML's keys win a name)."""
        self._stored = tuple(stored)
        self.current = self._with_stored(self.loaded)

    def _with_stored(self, config: Config) -> Config:
        keys, clashes = merged_keys(config.keys, self._stored)
        for name in sorted(set(clashes) - self._clashes):
            log.warning(
                "key %r is both in the configuration and made at run time: the configuration's "
                "is used; revoke the run-time one or rename it",
                name,
            )
        self._clashes = set(clashes)
        return config if keys is config.keys else dataclasses.replace(config, keys=keys)

    async def reload(self, trigger: str, actor: Mapping[str, str] | None = None) -> ReloadOutcome:
        """`actor`: who asked (an admin request's caller), for the reload's listeners."""
        async with self._lock:
            before = self.current
            if self.path is None:
                errors = ["started with --model: there is no file to load"]
                return self._rejected(trigger, errors, before, actor)
            try:
                loaded = await self._load_settled(self.path)
            except ConfigError as exc:
                return self._rejected(trigger, [str(i) for i in exc.issues], before, actor)
            except Exception as exc:  # an unreadable file must not take the watcher down
                return self._rejected(trigger, [f"{type(exc).__name__}: {exc}"], before, actor)
            config = self._with_stored(loaded)
            if refusal := _drops_authentication(self.current, config):
                return self._rejected(trigger, [refusal], before, actor)
            self.loaded = loaded
            self.current = config
            for listener in self._listeners:
                listener(config)
            outcome = ReloadOutcome(True, trigger, time.time(), config.version)
            for told in self._reload_listeners:
                told(outcome, before, config, actor)
            self.last_reload = outcome
            self._metrics.config_reloads.labels("success").inc()
            self._metrics.config_last_reload_ok.set(1)
            self._metrics.set_config_version(config.version, config.loaded_at)
            log.info("configuration %s loaded (%s) from %s", config.version, trigger, self.path)
            for warning in config.warnings:
                log_lines(log.warning, f"config: {warning}")
            for note in config.notes:
                log_lines(log.info, f"config: {note}")
            return outcome

    async def _load_settled(self, path: str | os.PathLike[str]) -> Config:
        """The configuration once its files' contents have stayed the same for
        server.reload_settle_s and did not change while they were loaded."""
        settle_s = self.current.server.reload_settle_s
        contents = await asyncio.to_thread(_contents_digest, path)
        for _ in range(MAX_SETTLE_ROUNDS):
            await asyncio.sleep(settle_s)
            # Taken first: an edit after it is a change for the watcher; an invalid file is
            # not reloaded again until it changes.
            self._fingerprint = _fingerprint(path)
            config = await asyncio.to_thread(_load_between, path, contents)
            if config is not None:
                return config
            contents = await asyncio.to_thread(_contents_digest, path)
        self._fingerprint = _fingerprint(path)
        message = (
            f"the files kept changing for {MAX_SETTLE_ROUNDS} x {settle_s:g} s "
            "(server.reload_settle_s); not applied"
        )
        raise ConfigError([ConfigIssue(os.fspath(path), "", message)])

    def _rejected(
        self,
        trigger: str,
        errors: list[str],
        before: Config,
        actor: Mapping[str, str] | None,
    ) -> ReloadOutcome:
        outcome = ReloadOutcome(False, trigger, time.time(), self.current.version, tuple(errors))
        for told in self._reload_listeners:
            told(outcome, before, None, actor)
        self.last_reload = outcome
        self._metrics.config_reloads.labels("failure").inc()
        self._metrics.config_last_reload_ok.set(0)
        rejected = f"configuration reload ({trigger}) rejected; still serving {outcome.version}:"
        log_lines(log.error, "\n  ".join([rejected, *errors]))
        return outcome

    async def watch(self) -> None:
        """Poll the files' stat fingerprint; cheap enough to run every second forever."""
        while True:
            await asyncio.sleep(self.current.server.watch_interval_s)
            fingerprint = _fingerprint(self.path)
            if fingerprint != self._fingerprint:
                await self.reload("watch")


def _drops_authentication(current: Config, new: Config) -> str | None:
    """Why `new` must not replace `current` by a reload: it would open what is closed now."""
    restart = "; restart the proxy to run without them on purpose"
    if current.keys.api_keys and not new.keys.api_keys:
        return (
            f"keys.api_keys: the new configuration has no API keys (the running one has "
            f"{len(current.keys.api_keys)}), so loopback clients would be served without a "
            f"key{restart}"
        )
    if current.keys.admin_digest is not None and new.keys.admin_digest is None:
        return (
            "keys.admin_key: the new configuration has no admin key, so loopback clients "
            f"would reach the admin routes without one{restart}"
        )
    return None


def _contents_digest(path: str | os.PathLike[str]) -> bytes:
    """What the config files hold now (names and bytes); missing files read as empty."""
    digest = hashlib.blake2b(digest_size=16)
    try:
        files = config_sources(path)
    except ConfigError:
        return b""
    for file in files:
        digest.update(file.name.encode() + b"\0")
        try:
            digest.update(file.read_bytes())
        except OSError:
            digest.update(b"\0missing")
        digest.update(b"\0")
    return digest.digest()


def _load_between(path: str | os.PathLike[str], contents: bytes) -> Config | None:
    """The configuration, if the files held `contents` before and after it was read; else
    None (they are still being written)."""
    if _contents_digest(path) != contents:
        return None
    config = load_config(path)
    return config if _contents_digest(path) == contents else None


def _fingerprint(path: str | os.PathLike[str] | None) -> tuple[object, ...]:
    if path is None:
        return ()
    try:
        return tuple(sources_fingerprint(path))
    except OSError:  # a file mid-replace or a removed folder: the reload will say what is wrong
        return ()
