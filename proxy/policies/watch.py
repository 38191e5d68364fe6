"""Holds the active Config and replaces it on file edits, SIGHUP or an admin request.

The swap is one reference assignment: a request keeps the Config it read at its start. A
configuration that fails to load never replaces the active one; the failure is logged, counted
and kept for /admin/policies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.metrics import Metrics
from proxy.policies.loader import ConfigError, load_config, sources_fingerprint
from proxy.policies.spec import Config

log = logging.getLogger("agentproxy.config")


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


class ConfigHolder:
    def __init__(
        self,
        path: str | os.PathLike[str] | None,  # None: given on the command line, no file
        config: Config,
        metrics: Metrics,
    ) -> None:
        self.path = path
        self.current = config
        self.last_reload: ReloadOutcome | None = None
        self._metrics = metrics
        self._listeners: list[Callable[[Config], None]] = []
        self._lock = asyncio.Lock()
        self._fingerprint = _fingerprint(path)
        metrics.set_config_version(config.version, config.loaded_at)
        metrics.config_last_reload_ok.set(1)

    def on_change(self, listener: Callable[[Config], None]) -> None:
        self._listeners.append(listener)

    async def reload(self, trigger: str) -> ReloadOutcome:
        async with self._lock:
            if self.path is None:
                return self._rejected(trigger, ["started with --model: there is no file to load"])
            self._fingerprint = _fingerprint(self.path)
            try:
                config = await asyncio.to_thread(load_config, self.path)
            except ConfigError as exc:
                return self._rejected(trigger, [str(issue) for issue in exc.issues])
            except Exception as exc:  # an unreadable file must not take the watcher down
                return self._rejected(trigger, [f"{type(exc).__name__}: {exc}"])
            self.current = config
            for listener in self._listeners:
                listener(config)
            outcome = ReloadOutcome(True, trigger, time.time(), config.version)
            self.last_reload = outcome
            self._metrics.config_reloads.labels("success").inc()
            self._metrics.config_last_reload_ok.set(1)
            self._metrics.set_config_version(config.version, config.loaded_at)
            log.info("configuration %s loaded (%s) from %s", config.version, trigger, self.path)
            for warning in config.warnings:
                log.warning("config: %s", warning)
            for note in config.notes:
                log.info("config: %s", note)
            return outcome

    def _rejected(self, trigger: str, errors: list[str]) -> ReloadOutcome:
        outcome = ReloadOutcome(False, trigger, time.time(), self.current.version, tuple(errors))
        self.last_reload = outcome
        self._metrics.config_reloads.labels("failure").inc()
        self._metrics.config_last_reload_ok.set(0)
        log.error(
            "configuration reload (%s) rejected; still serving %s:\n  %s",
            trigger,
            self.current.version,
            "\n  ".join(errors),
        )
        return outcome

    async def watch(self) -> None:
        """Poll the files' stat fingerprint; cheap enough to run every second forever."""
        while True:
            await asyncio.sleep(self.current.server.watch_interval_s)
            fingerprint = _fingerprint(self.path)
            if fingerprint != self._fingerprint:
                await self.reload("watch")


def _fingerprint(path: str | os.PathLike[str] | None) -> tuple[object, ...]:
    if path is None:
        return ()
    try:
        return tuple(sources_fingerprint(path))
    except OSError:  # a file mid-replace or a removed folder: the reload will say what is wrong
        return ()
