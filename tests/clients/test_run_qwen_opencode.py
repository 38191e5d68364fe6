"""The real Qwen Code and opencode CLIs started by `agentproxy run --simulate`, told nothing but
what `run` gives them (no settings or config of their own): each asked to list the files runs
its shell tool, and the session the proxy recorded is the run's (they sent its id).

Neither is pinned in clients/package.json yet: this machine's npm registry lacks their other
platforms' optional packages (opencode-darwin-*, @teddyzhu/clipboard-*), so `npm ci` refuses a
lock that names them. The tests take them from the folder AGENTPROXY_CLIENTS names (or
clients/) and skip, even under CI, when it has none; run them with
e.g. `AGENTPROXY_CLIENTS=/tmp/npmtoday` after `npm install --prefix /tmp/npmtoday
@qwen-code/qwen-code opencode-ai`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.agentproxy_run import agentproxy_run

from .conftest import CLIENTS, CLIENTS_VAR, DEAD_PROXY, SCRATCH_FILES, scratch_repo
from .test_run_agents import replayed_after

HOW = f"run with {CLIENTS_VAR}=<a folder where `npm install @qwen-code/qwen-code opencode-ai` ran>"


@dataclass
class Agent:
    binary: Path
    workdir: Path
    home: Path

    def environment(self) -> dict[str, str]:
        """Sealed: a private HOME (no settings of the agent's), any host but 127.0.0.1
        unreachable, no update checks."""
        home = self.home
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "TMPDIR": str(home / "tmp"),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_RUNTIME_DIR": str(home / "run"),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "HTTP_PROXY": DEAD_PROXY,
            "HTTPS_PROXY": DEAD_PROXY,
            "http_proxy": DEAD_PROXY,
            "https_proxy": DEAD_PROXY,
            "NO_PROXY": "127.0.0.1,localhost,::1",
            "no_proxy": "127.0.0.1,localhost,::1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
        }


def agent(name: str, tmp_path: Path) -> Agent:
    binary = CLIENTS / "node_modules" / ".bin" / name
    if not binary.exists():  # not pinned in clients/: not a failure under CI
        pytest.skip(f"{name} not installed in {CLIENTS}: {HOW}")
    home = tmp_path / "home"
    home.mkdir()
    return Agent(binary, scratch_repo(tmp_path / "repo", SCRATCH_FILES), home)


async def test_qwen_code_asked_to_list_the_files_runs_ls_in_the_runs_session(
    tmp_path: Path,
) -> None:
    qwen = agent("qwen", tmp_path)
    env = qwen.environment()
    run = await agentproxy_run(
        "--simulate", "--", str(qwen.binary), "-p", "list the files here", "--yolo",
        env=env, cwd=qwen.workdir,
    )  # fmt: skip
    assert run.exit_code == 0, run.stdout + run.stderr
    assert "run_shell_command returned:" in run.stdout, run.stdout + run.stderr
    assert all(name in run.stdout for name in SCRATCH_FILES), run.stdout
    # The figures and the replay are those of the session named by the run's id.
    replayed_after(run, env, qwen.workdir)
    assert not (qwen.home / ".qwen" / "settings.json").exists()  # nothing of the user's touched


async def test_opencode_asked_to_list_the_files_runs_bash_in_the_runs_session(
    tmp_path: Path,
) -> None:
    opencode = agent("opencode", tmp_path)
    env = opencode.environment()
    run = await agentproxy_run(
        "--simulate", "--", str(opencode.binary), "run", "list the files here",
        env=env, cwd=opencode.workdir,
    )  # fmt: skip
    assert run.exit_code == 0, run.stdout + run.stderr
    assert "bash returned:" in run.stdout, run.stdout + run.stderr
    assert all(name in run.stdout for name in SCRATCH_FILES), run.stdout
    replayed_after(run, env, opencode.workdir)
    assert not (opencode.home / ".config" / "opencode" / "opencode.json").exists()
