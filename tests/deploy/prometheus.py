"""A real Prometheus server for tests: the Debian/Ubuntu `prometheus` binary on a free loopback
port, with its own config and data folder, queried through its HTTP API.

    prom = Prometheus(tmp_path, targets=["127.0.0.1:4000"])
    prom.launch()                 # returns at once; the server boots in the background
    await prom.ready()            # or prom.start() = launch + wait, for synchronous callers
    await prom.wait_for_scrapes(3)
    prom.query('sum(rate(agentproxy_requests_total[1m]))')   # the result vector
    prom.close()

No skip: a machine without the binary fails the test, saying what to install (CI installs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.conftest import missing

INSTALL_HINT = "`apt-get install prometheus` (it brings promtool too)"


def binary(name: str) -> str:
    """Path of `name` (prometheus, promtool), or fail the test saying how to get it.
    PROMETHEUS_BIN / PROMTOOL_BIN override the lookup."""
    override = os.environ.get(f"{name.upper()}_BIN")
    found = (
        override
        or shutil.which(name)
        or next(
            (p for p in (f"/usr/bin/{name}", f"/usr/local/bin/{name}") if os.access(p, os.X_OK)),
            None,
        )
    )
    if not found or not os.access(found, os.X_OK):
        missing(f"`{name}` binary not found", INSTALL_HINT)
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PrometheusError(AssertionError):
    """The server failed to start, or a query came back with an error."""


class Prometheus:
    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        *,
        job: str = "agentproxy",
        scrape_interval: str = "1s",
        metrics_path: str = "/metrics",
        rule_files: Sequence[Path] = (),
    ) -> None:
        self.workdir = Path(workdir) / "prometheus"
        self.targets = list(targets)
        self.job = job
        self.scrape_interval = scrape_interval
        self.metrics_path = metrics_path
        self.rule_files = [Path(f).resolve() for f in rule_files]  # alerting/recording rules
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._log = self.workdir / "prometheus.log"

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config_text(self) -> str:
        targets = ", ".join(json.dumps(t) for t in self.targets)
        rules = ", ".join(json.dumps(str(f)) for f in self.rule_files)
        return textwrap.dedent(
            f"""\
            global:
              scrape_interval: {self.scrape_interval}
              scrape_timeout: {self.scrape_interval}
              evaluation_interval: {self.scrape_interval}
            rule_files: [{rules}]
            scrape_configs:
              - job_name: {self.job}
                metrics_path: {self.metrics_path}
                static_configs:
                  - targets: [{targets}]
            """
        )

    def launch(self) -> None:
        """Start the server in the background (see `ready`)."""
        executable = binary("prometheus")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(self.config_text())
        self.port = free_port()
        with self._log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    executable,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
            )

    async def ready(self, within_s: float = 20.0) -> None:
        """Wait, without blocking the event loop, until the server answers /-/ready."""
        deadline = time.monotonic() + within_s
        while not await asyncio.to_thread(self._is_ready):
            self._check_alive()
            if time.monotonic() > deadline:
                raise PrometheusError(f"Prometheus not ready after {within_s} s\n{self.log_tail()}")
            await asyncio.sleep(0.1)

    def start(self, within_s: float = 20.0) -> None:
        """`launch`, then block until ready (for callers without an event loop)."""
        self.launch()
        deadline = time.monotonic() + within_s
        while not self._is_ready():
            self._check_alive()
            if time.monotonic() > deadline:
                raise PrometheusError(f"Prometheus not ready after {within_s} s\n{self.log_tail()}")
            time.sleep(0.1)

    def close(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self.process = None

    def __enter__(self) -> Prometheus:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self._log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _check_alive(self) -> None:
        if self.process is None:
            raise PrometheusError("Prometheus was not launched")
        if self.process.poll() is not None:
            raise PrometheusError(
                f"Prometheus exited with {self.process.returncode}\n{self.log_tail()}"
            )

    def _is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    # --- HTTP API ------------------------------------------------------------------------

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the `data` of a successful answer, else PrometheusError."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as error:  # 400/422 carry the PromQL error as JSON
            try:
                body = json.loads(error.read())
            except ValueError:
                raise PrometheusError(f"{path}: HTTP {error.code}") from error
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Evaluate an instant query now: the result vector (a scalar becomes one sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    async def aquery(self, expr: str) -> list[dict[str, Any]]:
        """`query` off the event loop, so an in-process target can still be scraped."""
        return await asyncio.to_thread(self.query, expr)

    async def wait_for_scrapes(self, count: int = 3, within_s: float = 20.0) -> None:
        """Wait until every target has been scraped successfully `count` times from now."""
        started = time.time()
        seen: set[float] = set()
        deadline = time.monotonic() + within_s
        up = f'up{{job="{self.job}"}}'
        while True:
            # Both on the same evaluation: the oldest last scrape, and whether all went well.
            result = await self.aquery(f"min(timestamp({up})) and on() min({up}) == 1")
            if result and float(result[0]["value"][1]) > started:
                seen.add(float(result[0]["value"][1]))
                if len(seen) >= count:
                    return
            if time.monotonic() > deadline:
                targets = self.api("targets")["activeTargets"]
                raise PrometheusError(
                    f"only {len(seen)} of {count} scrapes in {within_s} s; targets: "
                    + json.dumps(
                        [
                            {k: t.get(k) for k in ("scrapeUrl", "health", "lastError")}
                            for t in targets
                        ]
                    )
                )
            await asyncio.sleep(0.2)
