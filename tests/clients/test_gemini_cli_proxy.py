"""The real Gemini CLI (@google/gemini-cli, pinned in clients/package.json) through the proxy's
Gemini wire, headless (`gemini -p ... --yolo`): a tool round trip whose call the simulator plans
(`run_shell_command` listing the scratch repository), answered by a chat deployment.

Sealed off like the other CLIs (tests/clients/conftest.py): a clean environment, HOME in a
temporary folder, HTTP(S)_PROXY at a closed loopback port, GOOGLE_GEMINI_BASE_URL at the proxy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from proxy.sim import Simulator, run_simulator
from tests.conftest import ProxyFactory
from tests.support.sim_responders import ToolRoundTrip

from .conftest import (
    CLIENTS,
    DEAD_PROXY,
    RUN_TIMEOUT_S,
    SCRATCH_FILES,
    ClientRun,
    _is_loopback,
    pinned_version,
    run_client,
    scratch_repo,
)

GEMINI_PACKAGE = "@google/gemini-cli"
GEMINI_BIN = CLIENTS / "node_modules" / ".bin" / "gemini"
GEMINI_MODEL = "gemini-sim"  # the alias the CLI is told to ask for (-m)
PROXY_KEY = "sk-proxy-gemini-cli"
UPSTREAM_KEY = "sk-sim-upstream-gemini"
SHELL_TOOL = "run_shell_command"


@dataclass
class GeminiCLI:
    """The pinned `gemini` CLI, with a scratch git repository and a private HOME."""

    binary: Path
    workdir: Path
    home: Path

    def environment(self, base_url: str, api_key: str) -> dict[str, str]:
        if not _is_loopback(urlsplit(base_url).hostname or ""):
            raise ValueError(f"refusing to point the Gemini CLI at {base_url}: loopback only")
        settings = self.home / ".gemini" / "settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(
            json.dumps(
                {
                    "security": {"auth": {"selectedType": "gemini-api-key"}},
                    "privacy": {"usageStatisticsEnabled": False},
                    "telemetry": {"enabled": False},
                    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
                }
            )
        )
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "TMPDIR": str(self.home / "tmp"),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "GOOGLE_GEMINI_BASE_URL": base_url,
            "GEMINI_API_KEY": api_key,
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "HTTP_PROXY": DEAD_PROXY,
            "HTTPS_PROXY": DEAD_PROXY,
            "NO_PROXY": "127.0.0.1,localhost,::1",
        }

    async def run(
        self, prompt: str, *, base_url: str, api_key: str, timeout_s: float = RUN_TIMEOUT_S
    ) -> ClientRun:
        (self.home / "tmp").mkdir(parents=True, exist_ok=True)
        command = [str(self.binary), "-m", GEMINI_MODEL, "-p", prompt, "--yolo"]
        env = self.environment(base_url, api_key)
        return await run_client(command, self.workdir, env, self.home, timeout_s, False)


@cache
def _installed() -> tuple[Path | None, str]:
    pinned = pinned_version(GEMINI_PACKAGE)
    if not GEMINI_BIN.exists():
        how = "run `make clients`" if shutil.which("npm") else "npm is not installed"
        return None, f"Gemini CLI not installed in {CLIENTS} ({how})"
    shown = subprocess.run(
        [str(GEMINI_BIN), "--version"], capture_output=True, text=True, timeout=60, check=False
    ).stdout.strip()
    if shown != pinned:
        return None, f"clients/ has Gemini CLI {shown!r}, pinned {pinned}: `make clients`"
    return GEMINI_BIN, ""


@pytest.fixture
def gemini_cli(tmp_path: Path) -> GeminiCLI:
    binary, why = _installed()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must run the Gemini CLI tests")
        pytest.skip(why)
    home = tmp_path / "home"
    home.mkdir()
    return GeminiCLI(binary, scratch_repo(tmp_path / "repo", SCRATCH_FILES), home)


async def test_gemini_cli_round_trips_through_the_proxy(
    gemini_cli: GeminiCLI, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    responder = ToolRoundTrip(tool=SHELL_TOOL, arguments={"command": "ls"})
    sim = Simulator(context_window=400_000, api_key=UPSTREAM_KEY, responder=responder)
    async with run_simulator(sim) as url:
        config = tmp_path / "agentproxy.yaml"
        config.write_text(
            textwrap.dedent(
                f"""\
                store: {{path: {tmp_path / "state"}}}
                keys:
                  api_keys: [{{name: gemini, key: {PROXY_KEY}}}]
                model_list:
                  - model_name: {GEMINI_MODEL}
                    litellm_params:
                      model: openai/sim
                      api_base: {url}/v1
                      api_key: {UPSTREAM_KEY}
                    model_info:
                      max_input_tokens: 400000
                """
            )
        )
        proxy = await start_proxy(config)
        base = str(proxy.make_url("")).rstrip("/")
        run = await gemini_cli.run("list the files here", base_url=base, api_key=PROXY_KEY)
    assert run.exit_code == 0, run.stdout + run.stderr
    assert [r.status for r in sim.requests] == [200] * len(sim.requests)
    assert all(r.api_key == UPSTREAM_KEY for r in sim.requests)  # never the client's key
    assert "The command listed:" in run.stdout, run.stdout + run.stderr
    assert all(name in run.stdout for name in SCRATCH_FILES), run.stdout
    offered = [r for r in sim.requests if r.body.get("tools")]
    assert offered, "the CLI's tools never reached the model"
