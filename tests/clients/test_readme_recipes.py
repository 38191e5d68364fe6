"""The README's Claude Code and Codex recipes, run with the real CLIs on the README's own setup:
`agentproxy simulate` as the README starts it (its default window: both CLIs open with 9-19k
tokens) behind `policies/local.yaml`. Every command, variable and config line comes from the
README's text; only the ports are swapped for free ones, and each CLI runs headless (`-p`,
`exec`) in the fixtures' sealed home."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory, _simulate
from tests.test_readme import README, ROOT, blocks

from .conftest import SCRATCH_FILES, ClaudeCode, Codex

README_PROXY = "127.0.0.1:4000"
README_SIMULATOR = "http://127.0.0.1:9911"


def readme_line(*words: str) -> list[str]:
    """The README's sh line running these words, as argv (its comment and `&` dropped)."""
    for code in blocks("sh"):
        for line in code.splitlines():
            argv = shlex.split(line.split("#")[0].replace("&", ""))
            if all(word in argv for word in words):
                return argv
    raise AssertionError(f"no README line runs {' '.join(words)}")


def split_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """`A=1 B=2 command args` -> ({A: 1, B: 2}, [command, args])."""
    env = {}
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    return env, argv


@pytest.fixture
def readme_simulator() -> Iterator[str]:
    """`agentproxy simulate` with the README's flags (its port swapped for a free one)."""
    argv = readme_line("simulate")
    options = argv[argv.index("simulate") + 1 :]
    if "--port" in options:
        at = options.index("--port")
        del options[at : at + 2]
    yield from _simulate(*options)


@pytest.fixture
async def readme_proxy(
    readme_simulator: str, start_proxy: ProxyFactory, tmp_path: Path
) -> TestServer:
    """`agentproxy serve --config policies/` (its local.yaml), on that simulator."""
    argv = readme_line("serve", "--config")
    config = ROOT / argv[argv.index("--config") + 1]
    local = (config / "local.yaml" if config.is_dir() else config).read_text()
    assert README_SIMULATOR in local
    path = tmp_path / "local.yaml"
    path.write_text(local.replace(README_SIMULATOR, readme_simulator))
    return await start_proxy(path)


def at_proxy(text: str, proxy: TestServer) -> str:
    assert README_PROXY in text
    return text.replace(README_PROXY, f"127.0.0.1:{proxy.port}")


async def test_the_claude_code_recipe_runs_as_written(
    any_claude_code: ClaudeCode, readme_proxy: TestServer
) -> None:
    claude_code = any_claude_code
    env, argv = split_env(readme_line("claude", "--model", "ANTHROPIC_API_KEY=local"))
    assert argv[0] == "claude" and set(env) == {"ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"}
    run = await claude_code.run(
        'Bash({"command": "ls"})',  # the simulated model calls a tool named so
        base_url=at_proxy(env["ANTHROPIC_BASE_URL"], readme_proxy),
        api_key=env["ANTHROPIC_API_KEY"],
        args=argv[1:],
    )
    assert run.exit_code == 0, run.stdout + run.stderr
    assert "Bash returned:" in run.stdout, run.stdout
    assert all(name in run.stdout for name in SCRATCH_FILES), run.stdout


async def test_the_codex_recipe_runs_as_written(codex: Codex, readme_proxy: TestServer) -> None:
    (config,) = blocks("toml")
    invocation = re.search(r"`((?:[A-Z_]+=\S+ )+)codex`", README)
    assert invocation is not None, "the README says how to start codex with its key"
    env, _ = split_env(invocation.group(1).split())
    codex.config_toml = at_proxy(config, readme_proxy)
    codex.extra_env = env
    run = await codex.run('exec_command({"cmd": "ls"})', base_url="", api_key="")
    assert run.exit_code == 0, run.stdout + run.stderr
    assert "exec_command returned:" in run.stdout, run.stdout
    assert all(name in run.stdout for name in SCRATCH_FILES), run.stdout
