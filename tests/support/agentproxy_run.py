"""`agentproxy run` as a user runs it (a real process), and a proxy that notes which session
each answer went to: what tests/runtime/test_run_agent.py and tests/clients/test_run_agents.py
share."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from proxy.app import build_app
from proxy.runtime import identity
from tests.conftest import ServedLikeServe

ROOT = Path(__file__).resolve().parents[2]
# What the user's shell may hold that would point an agent elsewhere than the test says.
_LEAKY = re.compile(r"^(OPENAI_|ANTHROPIC_|AGENTPROXY_|CODEX_|CLAUDE_)")


@dataclass
class RunResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def session(self) -> str:
        found = re.search(r"session (run-[0-9a-f]{12})", self.stderr)
        assert found, self.stderr
        return found.group(1)

    @property
    def started_url(self) -> str | None:
        found = re.search(r"started a proxy on (http://\S+)", self.stderr)
        return found.group(1) if found else None


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without any agent's or proxy's settings, HOME in `home`
    and the runtime files (proxy/runtime/identity.py) in `home`/run."""
    env = {name: value for name, value in os.environ.items() if not _LEAKY.match(name)}
    home.mkdir(parents=True, exist_ok=True)
    return {**env, "HOME": str(home), "XDG_RUNTIME_DIR": str(home / "run"), **extra}


async def start_run(
    *args: str, env: Mapping[str, str], cwd: Path | None = None
) -> asyncio.subprocess.Process:
    """`agentproxy run ARGS` in its own session (no terminal: signals sent to it are its
    own), output piped."""
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "proxy", "run", *args),
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )


async def agentproxy_run(
    *args: str, env: Mapping[str, str], cwd: Path | None = None, timeout_s: float = 120.0
) -> RunResult:
    process = await start_run(*args, env=env, cwd=cwd)
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        pytest.fail(f"agentproxy run did not finish within {timeout_s:g} s")
    assert process.returncode is not None
    return RunResult(process.returncode, out.decode(), err.decode())


@contextlib.asynccontextmanager
async def session_noting_proxy(
    config: Path, env: Mapping[str, str]
) -> AsyncIterator[tuple[ServedLikeServe, list[str]]]:
    """The proxy on `config`, started as `serve` is by the user of `env` (its runtime file
    written there: `run` may use it), and the `x-agentproxy-session` of every answer it
    gave."""
    sessions: list[str] = []
    secret = identity.new_secret()
    app = build_app(config, identity=secret)

    async def note(request: web.Request, response: web.StreamResponse) -> None:
        if session := response.headers.get("x-agentproxy-session"):
            sessions.append(session)

    app.on_response_prepare.append(note)
    server = ServedLikeServe(app)
    await server.start_server()
    claimed = identity.claim(server.port, secret, env)
    try:
        yield server, sessions
    finally:
        identity.release(claimed, secret)
        await server.close()
