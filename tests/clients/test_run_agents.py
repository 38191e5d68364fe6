"""The real Codex and Claude Code CLIs started by `agentproxy run`, told nothing but what `run`
gives them: each reaches the proxy (one already running, with keys; or the embedded one on the
simulator, as a newcomer would try it) and every answer belongs to the run's session."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

from proxy.runtime.run_simulated import simulate_config_path
from proxy.sim import Simulator, run_simulator
from tests.support.agentproxy_run import ROOT, RunResult, agentproxy_run, session_noting_proxy
from tests.support.sim_responders import ToolRoundTrip, codex_shell_round_trip

from .conftest import CODEX_KEY_VAR, CODEX_MODEL, SCRATCH_FILES, ClaudeCode, Codex
from .test_claude_code import bash_round_trip
from .test_codex import output_text, shell_round_trip
from .test_gemini_cli_proxy import GeminiCLI
from .test_gemini_cli_proxy import gemini_cli as gemini_cli  # the fixture

PROXY_KEY = "sk-proxy-run"
UPSTREAM_KEY = "sk-sim-upstream-run"
CLAUDE_MODEL = "claude-opus-5-5"  # what Claude Code asks for by default


def proxy_config(tmp_path: Path, alias: str, model: str, base: str) -> Path:
    config = tmp_path / "agentproxy.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            store: {{path: {tmp_path / "state"}}}
            keys:
              api_keys: [{{name: runner, key: {PROXY_KEY}}}]
            model_list:
              - model_name: {alias}
                litellm_params: {{model: {model}, api_base: "{base}", api_key: {UPSTREAM_KEY}}}
                model_info: {{max_input_tokens: 400000}}
            """
        )
    )
    return config


def codex_env(codex: Codex) -> dict[str, str]:
    """The sealed environment of tests/clients, CODEX_HOME holding the user's own config: no
    provider of ours, a model the proxy serves."""
    env = codex.environment("http://127.0.0.1:9", "unused")
    del env[CODEX_KEY_VAR]
    (codex.home / "tmp").mkdir(parents=True, exist_ok=True)
    (codex.codex_home / "config.toml").write_text(f'model = "{CODEX_MODEL}"\n')
    return env


def claude_env(claude_code: ClaudeCode) -> dict[str, str]:
    """The sealed environment of tests/clients, with no base URL or key: `run` gives them."""
    env = claude_code.environment("http://127.0.0.1:9", "unused")
    del env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"]
    (claude_code.home / "tmp").mkdir(parents=True, exist_ok=True)
    return env


async def test_codex_started_by_run_reaches_a_running_proxy_in_the_runs_session(
    codex: Codex, tmp_path: Path
) -> None:
    sim = Simulator(
        context_window=400_000, api_key=UPSTREAM_KEY, responder=codex_shell_round_trip()
    )
    env = codex_env(codex)
    async with run_simulator(sim) as url:
        config = proxy_config(tmp_path, CODEX_MODEL, "openai/gpt-sim", f"{url}/v1")
        async with session_noting_proxy(config, env) as (proxy, sessions):
            run = await agentproxy_run(
                *("--port", str(proxy.port), "--key", PROXY_KEY, "--"),
                *(str(codex.binary), "exec", "--skip-git-repo-check", "list the files here"),
                env=env, cwd=codex.workdir,
            )  # fmt: skip
    assert run.exit_code == 0, run.stderr
    assert "The command listed:" in run.stdout
    assert [r.status for r in sim.requests] == [200] * len(sim.requests)
    trip = shell_round_trip(sim.requests[-1])
    assert trip is not None and all(name in output_text(trip[1]) for name in SCRATCH_FILES)
    assert sessions and set(sessions) == {run.session}
    assert (codex.codex_home / "config.toml").read_text() == f'model = "{CODEX_MODEL}"\n'


async def test_codex_started_by_run_on_the_simulator_answers(codex: Codex) -> None:
    run = await agentproxy_run(
        "--simulate", "--", str(codex.binary), "exec", "--skip-git-repo-check", "hello there",
        env=codex_env(codex), cwd=codex.workdir,
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr
    assert "You said: hello there" in run.stdout


async def test_claude_code_started_by_run_reaches_a_running_proxy_in_the_runs_session(
    claude_code: ClaudeCode, tmp_path: Path
) -> None:
    sim = Simulator(context_window=200_000, api_key=UPSTREAM_KEY, responder=ToolRoundTrip())
    env = claude_env(claude_code)
    async with run_simulator(sim) as url:
        config = proxy_config(tmp_path, CLAUDE_MODEL, "anthropic/claude-sim", url)
        async with session_noting_proxy(config, env) as (proxy, sessions):
            run = await agentproxy_run(
                *("--port", str(proxy.port), "--key", PROXY_KEY, "--"),
                *(str(claude_code.binary), "-p", "list the files here"),
                "--dangerously-skip-permissions",
                env=env, cwd=claude_code.workdir,
            )  # fmt: skip
    assert run.exit_code == 0, run.stderr
    assert all(r.status == 200 for r in sim.requests), [r.status for r in sim.requests]
    assert bash_round_trip(sim.requests[-1]) is not None
    assert all(name in run.stdout for name in SCRATCH_FILES), run.stdout
    assert sessions and set(sessions) == {run.session}


async def test_claude_code_started_by_run_on_the_simulator_answers(
    claude_code: ClaudeCode,
) -> None:
    run = await agentproxy_run(
        "--simulate", "--", str(claude_code.binary), "-p", "hello there",
        env=claude_env(claude_code), cwd=claude_code.workdir,
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr
    assert run.stdout.startswith("You said: hello there"), run.stdout  # the simulator's echo


# -- a newcomer's first run: a natural request, a tool call, the figures, a replay -----------

FIGURES = re.compile(
    r"agentproxy run: session (run-[0-9a-f]{12}): (\d+) turns?, (\d+) calls?, "
    r"tokens received ([\d,]+), sent ([\d,]+), rewrites: (.+), cost (\S+)\n"
)
REPLAY = re.compile(r"agentproxy run: replay it: (agentproxy replay .+)\n")


def replayed_after(run: RunResult, env: dict[str, str], cwd: Path) -> dict[str, object]:
    """The figures `run` printed once the agent exited, checked, and what its printed replay
    line gives, run as printed (the proxy long stopped); the replay's JSON."""
    figures = FIGURES.search(run.stderr)
    assert figures is not None, run.stderr
    session, turns, calls, received, sent, _, cost = figures.groups()
    assert session == run.session and int(turns) >= 1
    assert int(calls) >= 2  # the tool call, then the summary
    assert int(received.replace(",", "")) > 0 and int(sent.replace(",", "")) > 0
    assert cost == "\u2013"  # an en dash: the simulated model has no price
    line = REPLAY.search(run.stderr)
    assert line is not None, run.stderr
    argv = shlex.split(line.group(1))
    assert argv[:4] == ["agentproxy", "replay", "--session", run.session]
    replay = subprocess.run(
        [sys.executable, "-m", "proxy", *argv[1:], "--json"],
        env={**env, "PYTHONPATH": str(ROOT)}, cwd=cwd, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    replayed: dict[str, object] = json.loads(replay.stdout)
    rows, totals = replayed["calls"], replayed["totals"]
    assert isinstance(rows, list) and len(rows) == int(calls)
    assert isinstance(totals, dict)
    assert (totals["turns"], totals["calls"]) == (int(turns), int(calls))  # as `run` counted
    return replayed


async def test_claude_code_asked_to_list_the_files_calls_bash_and_run_sums_up(
    claude_code: ClaudeCode,
) -> None:
    env = claude_env(claude_code)
    run = await agentproxy_run(
        "--simulate", "--", str(claude_code.binary), "-p", "list the files here",
        "--dangerously-skip-permissions", env=env, cwd=claude_code.workdir,
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr
    assert run.stdout.startswith("Bash returned:"), run.stdout  # it listed, then said so
    assert all(name in run.stdout for name in SCRATCH_FILES), run.stdout
    replayed_after(run, env, claude_code.workdir)


async def test_codex_asked_to_list_the_files_runs_ls_and_run_sums_up(codex: Codex) -> None:
    """Codex's own default model (no model in its config): its tools, in `additional_tools`,
    reach the simulated model, which lists through code mode's `exec`."""
    env = codex_env(codex)
    (codex.codex_home / "config.toml").write_text("")  # the model Codex picks by itself
    run = await agentproxy_run(
        "--simulate", "--", str(codex.binary), "exec", "--skip-git-repo-check",
        "list the files here", env=env, cwd=codex.workdir,
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr
    assert "/bin/bash -lc ls" in run.stderr  # Codex shows the command it ran, and its output
    assert all(name in run.stderr for name in SCRATCH_FILES), run.stderr
    assert "exec returned:" in run.stdout, run.stdout + run.stderr  # then the model's summary
    # exec's input is JavaScript (a custom tool's free text), not JSON arguments: repair let
    # it be, so the model saw no false warning about it.
    log = Path(simulate_config_path(env)).parent / "events.jsonl"
    recorded = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    flagged = [e for e in recorded if e["action"] == "flagged_bad_arguments"]
    assert flagged == [], flagged
    replayed_after(run, env, codex.workdir)


async def test_the_gemini_cli_asked_to_list_the_files_runs_ls_and_run_sums_up(
    gemini_cli: GeminiCLI,
) -> None:
    env = gemini_cli.environment("http://127.0.0.1:9", "unused")
    del env["GOOGLE_GEMINI_BASE_URL"], env["GEMINI_API_KEY"]  # `run` gives them
    (gemini_cli.home / "tmp").mkdir(parents=True, exist_ok=True)
    run = await agentproxy_run(
        "--simulate", "--", str(gemini_cli.binary), "-p", "list the files here", "--yolo",
        env=env, cwd=gemini_cli.workdir,
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr
    assert "run_shell_command returned:" in run.stdout, run.stdout + run.stderr
    assert all(name in run.stdout for name in SCRATCH_FILES), run.stdout
    assert "Retry attempts exhausted" not in run.stderr  # its router got its JSON
    replayed_after(run, env, gemini_cli.workdir)


async def test_a_gemini_cli_without_an_auth_type_is_told_what_to_choose(
    gemini_cli: GeminiCLI,
) -> None:
    """The real CLI, with GOOGLE_GEMINI_BASE_URL set and no auth type chosen, refuses to start
    (it takes the base URL for a "gateway" auth): `run` says what to choose."""
    env = gemini_cli.environment("http://127.0.0.1:9", "unused")
    del env["GOOGLE_GEMINI_BASE_URL"], env["GEMINI_API_KEY"]
    settings = gemini_cli.home / ".gemini" / "settings.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "security": {}}))
    (gemini_cli.home / "tmp").mkdir(parents=True, exist_ok=True)
    run = await agentproxy_run(
        "--simulate", "--", str(gemini_cli.binary), "-p", "list the files here",
        env=env, cwd=gemini_cli.workdir,
    )  # fmt: skip
    assert run.exit_code != 0, run.stdout
    assert "no request of it reached the proxy" in run.stderr, run.stderr
    assert '"selectedType": "gemini-api-key"' in run.stderr, run.stderr
