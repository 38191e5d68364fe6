"""Real agent CLIs, run headless against any loopback base URL (the simulator or the proxy).

The CLIs come from clients/ (pinned in clients/package-lock.json; `make test` runs
`npm ci --prefix clients`). Where it is not installed the tests skip and say how to get it,
except under CI, which must run them. AGENTPROXY_CLIENTS names another folder whose
node_modules to take them from instead (what npm resolves today, say): the versions expected
are then the ones installed there, and the only Claude Code release is its
`@anthropic-ai/claude-code`.

Each run is sealed off from the machine: a clean environment (no inherited ANTHROPIC_*,
CLAUDE_*, OPENAI_*, CODEX_* or proxy variables), HOME (and CLAUDE_CONFIG_DIR / CODEX_HOME) in a
temporary folder, Claude Code's non-essential traffic (telemetry, error reports, auto-update)
off, and HTTP(S)_PROXY pointed at a closed loopback port so any request to a host other than
127.0.0.1 fails instead of leaving the machine. Codex ignores OPENAI_BASE_URL: its CODEX_HOME
config.toml names a model provider whose base_url is the one given. With `trace=True` (and
strace present) the run also reports every socket it connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENTS_VAR = "AGENTPROXY_CLIENTS"  # another folder holding node_modules, e.g. the latest CLIs
OTHER_CLIENTS = bool(os.environ.get(CLIENTS_VAR))
CLIENTS = Path(os.environ[CLIENTS_VAR]).resolve() if OTHER_CLIENTS else REPO / "clients"
CLAUDE_PACKAGE = "@anthropic-ai/claude-code"
CLAUDE_BIN = CLIENTS / "node_modules" / ".bin" / "claude"
CODEX_PACKAGE = "@openai/codex"
CODEX_BIN = CLIENTS / "node_modules" / ".bin" / "codex"
CODEX_MODEL = "sim-codex"  # the alias Codex asks for (unknown to it: fallback model metadata)
CODEX_KEY_VAR = "AGENTPROXY_TEST_KEY"  # the provider's env_key
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, connections are refused
RUN_TIMEOUT_S = 120.0
SCRATCH_FILES = {
    "README.md": "# scratch\nA repository made for one test.\n",
    "main.py": 'print("hello")\n',
    "notes.txt": "remember the milk\n",
}
_CONNECT = re.compile(
    r"connect\(\d+, \{sa_family=AF_INET6?, sin6?_port=htons\((\d+)\), "
    r'(?:sin_addr=inet_addr\("([^"]+)"\)|.*?inet_pton\(AF_INET6, "([^"]+)")'
)


def pinned_version(package: str = CLAUDE_PACKAGE) -> str:
    """The version clients/package.json pins; under AGENTPROXY_CLIENTS the one installed there
    (its package.json holds ranges, not pins)."""
    if OTHER_CLIENTS:
        installed = CLIENTS / "node_modules" / package / "package.json"
        if not installed.exists():
            return "(not installed)"
        found: str = json.loads(installed.read_text())["version"]
        return found
    manifest = json.loads((CLIENTS / "package.json").read_text())
    version: str = manifest["dependencies"][package]
    return version


@dataclass
class ClientRun:
    exit_code: int
    stdout: str
    stderr: str
    connections: list[tuple[str, int]] | None = None  # (address, port); None: not traced

    def off_loopback(self) -> list[tuple[str, int]]:
        return [c for c in self.connections or [] if not ipaddress.ip_address(c[0]).is_loopback]


@dataclass
class ClaudeCode:
    """The pinned `claude` CLI, with a scratch git repository and a private home."""

    binary: Path
    workdir: Path  # the scratch repository Claude Code works in
    home: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def config_dir(self) -> Path:
        return self.home / ".claude"

    def environment(self, base_url: str, api_key: str) -> dict[str, str]:
        if not _is_loopback(urlsplit(base_url).hostname or ""):
            raise ValueError(f"refusing to point Claude Code at {base_url}: loopback only")
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "TMPDIR": str(self.home / "tmp"),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": api_key,
            "CLAUDE_CONFIG_DIR": str(self.config_dir),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "IS_SANDBOX": "1",
            "HTTP_PROXY": DEAD_PROXY,
            "HTTPS_PROXY": DEAD_PROXY,
            "NO_PROXY": "127.0.0.1,localhost,::1",
            **self.extra_env,
        }

    async def run(
        self,
        prompt: str,
        *,
        base_url: str,
        api_key: str,
        args: Sequence[str] = (),
        timeout_s: float = RUN_TIMEOUT_S,
        trace: bool = False,
    ) -> ClientRun:
        """`claude -p PROMPT --dangerously-skip-permissions` in the scratch repository.

        Async, so a server on this event loop (run_simulator, a test proxy) can answer it."""
        (self.home / "tmp").mkdir(parents=True, exist_ok=True)
        command = [str(self.binary), "-p", prompt, "--dangerously-skip-permissions", *args]
        env = self.environment(base_url, api_key)
        return await run_client(command, self.workdir, env, self.home, timeout_s, trace)


async def run_client(
    command: list[str], cwd: Path, env: dict[str, str], home: Path, timeout_s: float, trace: bool
) -> ClientRun:
    """Run a client CLI with stdin from /dev/null; with `trace` (and strace working) record
    every socket it connected."""
    trace_file = home / "connect.trace"
    if trace and strace_works():
        command = ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace_file), *command]
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group: a timeout ends its children too
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        pytest.fail(f"{Path(command[0]).name} did not finish within {timeout_s:g} s")
    connections = _connections(trace_file) if trace_file.exists() else None
    assert process.returncode is not None
    return ClientRun(process.returncode, out.decode(), err.decode(), connections)


@dataclass
class Codex:
    """The pinned `codex` CLI, with a scratch git repository, a private HOME and a CODEX_HOME
    whose config.toml points a model provider at the base URL of each run."""

    binary: Path
    workdir: Path
    home: Path
    model: str = CODEX_MODEL
    provider_options: dict[str, str | int | bool] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    config_toml: str | None = None  # a config.toml as given (the README's), not config()

    @property
    def codex_home(self) -> Path:
        return self.home / ".codex"

    def config(self, base_url: str) -> str:
        """config.toml: the model alias, and a Responses provider at `base_url` + "/v1"."""
        if not _is_loopback(urlsplit(base_url).hostname or ""):
            raise ValueError(f"refusing to point Codex at {base_url}: loopback only")
        provider: dict[str, str | int | bool] = {
            "name": "AgentProxy test upstream",
            "base_url": base_url.rstrip("/") + "/v1",
            "env_key": CODEX_KEY_VAR,
            "wire_api": "responses",
            "request_max_retries": 0,
            "stream_max_retries": 0,
            **self.provider_options,
        }
        lines = [
            f"model = {json.dumps(self.model)}",
            'model_provider = "agentproxy"',
            "",
            "[model_providers.agentproxy]",
            *(f"{key} = {json.dumps(value)}" for key, value in provider.items()),
        ]
        return "\n".join(lines) + "\n"

    def given_config(self) -> str | None:
        """`config_toml`, once every provider in it is checked to be on loopback."""
        if self.config_toml is None:
            return None
        given = tomllib.loads(self.config_toml)
        builtin = given.get("openai_base_url")  # the built-in `openai` provider's
        if builtin is not None and not _is_loopback(urlsplit(builtin).hostname or ""):
            raise ValueError(f"refusing to point Codex at {builtin}: loopback only")
        for provider in given.get("model_providers", {}).values():
            if not _is_loopback(urlsplit(provider.get("base_url", "")).hostname or ""):
                raise ValueError(f"refusing to point Codex at {provider}: loopback only")
        return self.config_toml

    def environment(self, base_url: str, api_key: str) -> dict[str, str]:
        self.codex_home.mkdir(parents=True, exist_ok=True)
        (self.codex_home / "config.toml").write_text(self.given_config() or self.config(base_url))
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "TMPDIR": str(self.home / "tmp"),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "CODEX_HOME": str(self.codex_home),
            CODEX_KEY_VAR: api_key,
            "HTTP_PROXY": DEAD_PROXY,
            "HTTPS_PROXY": DEAD_PROXY,
            "NO_PROXY": "127.0.0.1,localhost,::1",
            **self.extra_env,
        }

    async def run(
        self,
        prompt: str,
        *,
        base_url: str,
        api_key: str,
        args: Sequence[str] = (),
        timeout_s: float = RUN_TIMEOUT_S,
        trace: bool = False,
    ) -> ClientRun:
        """`codex exec --skip-git-repo-check PROMPT < /dev/null` in the scratch repository."""
        (self.home / "tmp").mkdir(parents=True, exist_ok=True)
        env = self.environment(base_url, api_key)
        command = [str(self.binary), "exec", "--skip-git-repo-check", *args, prompt]
        return await run_client(command, self.workdir, env, self.home, timeout_s, trace)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it would be resolved, and could go anywhere
        return False


def _connections(trace_file: Path) -> list[tuple[str, int]]:
    found = []
    for match in _CONNECT.finditer(trace_file.read_text()):
        port, ipv4, ipv6 = match.groups()
        found.append((ipv4 or ipv6, int(port)))
    return found


@cache
def strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(["strace", "-o", os.devnull, "true"], capture_output=True, check=False)
    return probe.returncode == 0


@cache
def _installed_codex() -> tuple[Path | None, str]:
    """The pinned binary, or None and why it cannot be used."""
    pinned = pinned_version(CODEX_PACKAGE)
    if not CODEX_BIN.exists():
        how = "run `make clients`" if shutil.which("npm") else "npm is not installed"
        return None, f"Codex CLI not installed in {CLIENTS} ({how})"
    shown = subprocess.run(
        [str(CODEX_BIN), "--version"], capture_output=True, text=True, timeout=60, check=False
    ).stdout.strip()
    if shown != f"codex-cli {pinned}":
        return None, f"clients/ has Codex {shown!r}, pinned {pinned}: `make clients`"
    return CODEX_BIN, ""


def claude_pins() -> dict[str, Path]:
    """Every pinned Claude Code release, version -> its binary: the newest under its own name,
    older ones under npm aliases (`"claude-code-2.1.197": "npm:@anthropic-ai/claude-code@..."`),
    whose binary .bin/ does not link (the name `claude` is taken). Under AGENTPROXY_CLIENTS, the
    one release installed there."""
    if OTHER_CLIENTS:
        return {pinned_version(): CLAUDE_BIN}
    manifest = json.loads((CLIENTS / "package.json").read_text())
    pins = {}
    for name, spec in manifest["dependencies"].items():
        if name == CLAUDE_PACKAGE:
            pins[spec] = CLAUDE_BIN
        elif spec.startswith(f"npm:{CLAUDE_PACKAGE}@"):
            pins[spec.rpartition("@")[2]] = CLIENTS / "node_modules" / name / "bin" / "claude.exe"
    return pins


@cache
def _installed_claude(version: str | None = None) -> tuple[Path | None, str]:
    """The pinned binary (of `version`, else the newest pin), or None and why it cannot be
    used."""
    pinned = version or pinned_version()
    binary = claude_pins()[pinned]
    if not binary.exists():
        how = "run `make clients`" if shutil.which("npm") else "npm is not installed"
        return None, f"Claude Code {pinned} not installed in {CLIENTS} ({how})"
    shown = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False
    ).stdout
    if not shown.startswith(pinned + " "):
        return None, f"clients/ has Claude Code {shown.strip()!r}, pinned {pinned}: `make clients`"
    return binary, ""


def _claude_binary(version: str | None = None) -> Path:
    binary, why = _installed_claude(version)
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must run the Claude Code tests")
        pytest.skip(why)
    return binary


@pytest.fixture(scope="session")
def claude_binary() -> Path:
    return _claude_binary()


def scratch_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    git = ["git", "-c", "user.name=scratch", "-c", "user.email=scratch@example.invalid"]
    for step in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "scratch"]):
        subprocess.run([*git, *step], cwd=path, check=True, capture_output=True, timeout=30)
    return path


@pytest.fixture
def claude_code(claude_binary: Path, tmp_path: Path) -> ClaudeCode:
    home = tmp_path / "home"
    home.mkdir()
    return ClaudeCode(claude_binary, scratch_repo(tmp_path / "repo", SCRATCH_FILES), home)


@pytest.fixture(params=sorted(claude_pins()))
def any_claude_code(request: pytest.FixtureRequest, tmp_path: Path) -> ClaudeCode:
    """`claude_code`, once for every pinned release."""
    home = tmp_path / "home"
    home.mkdir()
    binary = _claude_binary(request.param)
    return ClaudeCode(binary, scratch_repo(tmp_path / "repo", SCRATCH_FILES), home)


@pytest.fixture(scope="session")
def codex_binary() -> Path:
    binary, why = _installed_codex()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must run the Codex tests")
        pytest.skip(why)
    return binary


@pytest.fixture
def codex(codex_binary: Path, tmp_path: Path) -> Codex:
    home = tmp_path / "home"
    home.mkdir()
    return Codex(codex_binary, scratch_repo(tmp_path / "repo", SCRATCH_FILES), home)
