"""`agentproxy run -- CMD`: a scripted agent (the openai SDK, configured by nothing but the
environment it is given) reaches the proxy, embedded or already running; its exit code and the
signals sent to `run` pass through; Claude Code and Codex get their settings (the real CLIs are
in tests/clients/test_run_agents.py)."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import signal
import stat
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.runtime import identity
from proxy.runtime.agent_env import codex_config
from proxy.state import IDENTITY
from tests.conftest import free_port, sim_config
from tests.runtime.test_server import refused
from tests.support.agentproxy_run import (
    ROOT,
    agentproxy_run,
    clean_env,
    session_noting_proxy,
    start_run,
)
from tests.test_cli import start_serve

# An SDK agent: base URL and key from the environment `agentproxy run` gave it.
AGENT = """
import os, sys, openai
client = openai.OpenAI(max_retries=0)
raw = client.chat.completions.with_raw_response.create(
    model=sys.argv[1], messages=[{"role": "user", "content": "hello proxy"}],
    extra_headers={"x-agentproxy-session": os.environ["AGENTPROXY_SESSION"]},
)
print(raw.parse().choices[0].message.content)
print(raw.headers["x-agentproxy-session"], raw.headers["x-agentproxy-model"])
sys.exit(int(sys.argv[2]))
"""
WAITER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
print("ready", flush=True)
time.sleep(60)
"""
# Counts the SIGINTs it gets (each delivery, as the C handler sees it), then reads a line.
COUNTER = """
import os, signal, sys
read_end, write_end = os.pipe()
os.set_blocking(write_end, False)
os.set_blocking(read_end, False)
signal.signal(signal.SIGINT, lambda *_: None)
signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
print("ready", flush=True)
line = input()
got = len(os.read(read_end, 100))
print(f"read {line} after {got} SIGINT", flush=True)
sys.exit(5)
"""
# `agentproxy run` on a terminal of its own (a pty), as a user types into it.
AT_TERMINAL = r"""
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-m", "proxy", "run", "--simulate", "--",
                              sys.executable, "-c", sys.argv[1]])
seen = b""
def until(text, deadline):
    global seen
    while text not in seen and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
until(b"ready", time.monotonic() + 60)
os.write(fd, b"\x03")  # Ctrl-C
time.sleep(0.5)
os.write(fd, b"typed\n")
until(b"SIGINT", time.monotonic() + 30)
print(seen.decode(errors="replace"))
print("exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
# Stands in for an agent (`claude`, `codex`, `qwen`...) on PATH: shows what it was started with.
SHOW = """#!{python}
import json, os, pathlib
home = pathlib.Path(os.environ.get("CODEX_HOME", "/nonexistent"))
print(json.dumps({{
    "env": {{k: v for k, v in os.environ.items() if k.startswith(("ANTHROPIC_", "OPENAI_",
                                                                   "AGENTPROXY_", "CODEX_",
                                                                   "GEMINI_", "GOOGLE_",
                                                                   "QWEN_", "OPENCODE_"))}},
    "qwen": json.loads(pathlib.Path(os.environ["QWEN_CODE_SYSTEM_SETTINGS_PATH"]).read_text())
            if "QWEN_CODE_SYSTEM_SETTINGS_PATH" in os.environ else None,
    "config": (home / "config.toml").read_text() if home.is_dir() else None,
    "links": {{p.name: os.readlink(p) for p in home.iterdir() if p.is_symlink()}}
             if home.is_dir() else {{}},
}}))
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return clean_env(tmp_path / "home")


def list_dir(folder: Path) -> list[str]:
    return [str(entry) for entry in folder.iterdir()]


def fake_agent(tmp_path: Path, name: str) -> str:
    """A PATH whose `name` is SHOW."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    script = folder / name
    script.write_text(SHOW.format(python=sys.executable))
    script.chmod(0o755)
    return f"{folder}:{Path(sys.executable).parent}:/usr/bin:/bin"


async def test_a_scripted_agent_reaches_the_embedded_simulated_proxy_and_its_code_passes(
    env: dict[str, str],
) -> None:
    run = await agentproxy_run("--simulate", "--", sys.executable, "-c", AGENT, "any-model", "3",
                               env=env)  # fmt: skip
    assert run.exit_code == 3, run.stderr
    answer, headers = run.stdout.splitlines()
    assert answer == "You said: hello proxy"
    assert headers == f"{run.session} sim"  # served under the catch-all alias
    assert f"/ui#session={run.session}" in run.stderr
    started = run.started_url
    assert started is not None, run.stderr
    assert refused(started)  # the embedded proxy stopped with the agent


async def test_a_proxy_already_running_is_used(
    config_path: Path, env: dict[str, str], tmp_path: Path
) -> None:
    async with session_noting_proxy(config_path, env) as (proxy, _):
        await a_proxy_already_running_is_used(proxy, env)


async def a_proxy_already_running_is_used(proxy: TestServer, env: dict[str, str]) -> None:
    port = str(proxy.port)
    run = await agentproxy_run("--port", port, "--", sys.executable, "-c", AGENT, "sim", "0",
                               env=env)  # fmt: skip
    assert run.exit_code == 0, run.stderr
    assert f"using the proxy running at http://127.0.0.1:{port}" in run.stderr
    assert run.started_url is None
    answer, headers = run.stdout.splitlines()
    assert answer == "You said: hello proxy"
    assert headers == f"{run.session} sim"
    assert f"http://127.0.0.1:{port}/ui#session={run.session}" in run.stderr


async def test_with_a_configuration_and_no_proxy_running_one_is_started_with_it(
    config_path: Path, env: dict[str, str], tmp_path: Path
) -> None:
    port = str(free_port())
    run = await agentproxy_run("--config", str(config_path), "--port", port, "--",
                               sys.executable, "-c", AGENT, "sim", "0", env=env)  # fmt: skip
    assert run.exit_code == 0, run.stderr
    assert run.started_url == f"http://127.0.0.1:{port}"  # where --port said
    assert run.stdout.splitlines()[0] == "You said: hello proxy"
    assert f"/ui#session={run.session}" in run.stderr
    log = tmp_path / ".agentproxy" / "run.log"  # the store's folder: out of the terminal
    assert "loopback" in log.read_text()  # the start-up warning about keys went there
    assert "loopback" not in run.stderr
    assert f"session {run.session}: 1 turn, 1 call, tokens received " in run.stderr
    assert "replay it" not in run.stderr  # its policy does not record it: nothing to replay


async def test_after_the_agent_its_figures_and_a_replay_line_that_works_once_it_stopped(
    env: dict[str, str], tmp_path: Path
) -> None:
    run = await agentproxy_run("--simulate", "--", sys.executable, "-c", AGENT, "any-model", "0",
                               env=env)  # fmt: skip
    assert run.exit_code == 0, run.stderr
    figures = re.search(
        rf"session {run.session}: 1 turn, 1 call, tokens received ([\d,]+), sent ([\d,]+), "
        "rewrites: none, cost \u2013\n", run.stderr
    )  # fmt: skip
    assert figures is not None, run.stderr
    assert int(figures.group(1).replace(",", "")) > 0
    state = tmp_path / "home" / ".local" / "state" / "agentproxy" / "simulate"
    assert f"the proxy's log: {state / 'run.log'}" in run.stderr
    assert (state / "run.log").is_file()  # kept where it said
    line = re.search(r"replay it: (agentproxy replay .+)\n", run.stderr)
    assert line is not None, run.stderr
    argv = shlex.split(line.group(1))
    assert argv[1:] == ["replay", "--session", run.session, "--config",
                        str(state / "simulate.yaml")]  # fmt: skip
    assert run.started_url is not None and refused(run.started_url)  # the proxy stopped
    [turn] = replayed(argv, env)["calls"]
    assert turn["valid"] is True and turn["status"] == 200, turn


def replayed(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """`agentproxy replay ...` as printed, with --json: its report."""
    replay = subprocess.run(
        [sys.executable, "-m", "proxy", *argv[1:], "--json"],
        env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    report: dict[str, Any] = json.loads(replay.stdout)
    return report


# An agent whose history has a tool call without its result: the proxy repairs it, twice.
DANGLING = """
import os, openai
client = openai.OpenAI(max_retries=0)
call = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
history = [{"role": "user", "content": "hello"},
           {"role": "assistant", "content": None, "tool_calls": [call]}]
for turn in ("go on", "and on"):
    history.append({"role": "user", "content": turn})
    client.chat.completions.create(model="sim", messages=history, extra_headers={
        "x-agentproxy-session": os.environ["AGENTPROXY_SESSION"]})
"""


async def test_the_figures_count_each_rewrite_of_the_session(env: dict[str, str]) -> None:
    run = await agentproxy_run("--simulate", "--", sys.executable, "-c", DANGLING, env=env)
    assert run.exit_code == 0, run.stderr
    assert f"session {run.session}: 2 turns, " in run.stderr
    assert "rewrites: repair.patched_dangling x2, cost" in run.stderr, run.stderr


RECORDED = "store: {path: STATE}\npolicies: [{name: recorded, record: {enabled: true}}]\n"


async def test_a_recorded_session_of_a_started_configuration_replays_as_printed(
    sim_server: TestServer, env: dict[str, str], tmp_path: Path
) -> None:
    """--config as given, relative: the printed line names it wherever replay is run from."""
    config = tmp_path / "recorded.yaml"
    url = str(sim_server.make_url("")).rstrip("/")
    config.write_text(sim_config(url, RECORDED.replace("STATE", str(tmp_path / "state"))))
    run = await agentproxy_run("--config", "recorded.yaml", "--", sys.executable, "-c", AGENT,
                               "sim", "0", env=env, cwd=tmp_path)  # fmt: skip
    assert run.exit_code == 0, run.stderr
    line = re.search(r"replay it: (agentproxy replay .+)\n", run.stderr)
    assert line is not None, run.stderr
    argv = shlex.split(line.group(1))
    assert argv[1:] == ["replay", "--session", run.session, "--config", str(config)]
    [turn] = replayed(argv, env)["calls"]
    assert turn["valid"] is True and turn["status"] == 200, turn


async def test_a_running_proxy_that_records_gets_a_replay_line_naming_its_configuration(
    sim_server: TestServer, env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "recorded.yaml"
    url = str(sim_server.make_url("")).rstrip("/")
    config.write_text(sim_config(url, RECORDED.replace("STATE", str(tmp_path / "state"))))
    async with session_noting_proxy(config, env) as (proxy, _):
        run = await agentproxy_run("--port", str(proxy.port), "--", sys.executable, "-c",
                                   AGENT, "sim", "0", env=env)  # fmt: skip
    assert run.exit_code == 0, run.stderr
    assert f"session {run.session}: 1 turn, " in run.stderr
    assert (
        f"replay it: agentproxy replay --session {run.session} --config CONFIG (CONFIG: the "
        "configuration the proxy runs with)"
    ) in run.stderr


async def test_an_agent_that_sent_nothing_is_said_so(env: dict[str, str]) -> None:
    run = await agentproxy_run("--simulate", "--", "true", env=env)
    assert run.exit_code == 0, run.stderr
    assert f"session {run.session}: no request of it reached the proxy" in run.stderr
    assert "replay it" not in run.stderr
    assert "auth type" not in run.stderr


async def test_a_gemini_cli_that_sent_nothing_is_told_the_auth_type_it_needs(
    env: dict[str, str], tmp_path: Path
) -> None:
    """As the Gemini CLI does with no auth type chosen: "Invalid auth method selected." and
    exit 41, nothing sent."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "gemini").write_text("#!/bin/sh\necho 'Invalid auth method selected.' >&2\nexit 41\n")
    (folder / "gemini").chmod(0o755)
    env["PATH"] = f"{folder}:/usr/bin:/bin"
    run = await agentproxy_run("--simulate", "--", "gemini", "-p", "hi", env=env)
    assert run.exit_code == 41, run.stderr
    assert "no request of it reached the proxy" in run.stderr
    assert '"selectedType": "gemini-api-key"' in run.stderr  # what to do about it


async def test_with_a_model_one_is_started_serving_it_under_any_name(
    sim_server: TestServer, env: dict[str, str]
) -> None:
    env["OPENAI_API_KEY"] = "sk-sim-upstream-secret"  # the provider's, as serve --model reads it
    sim_url = str(sim_server.make_url("/v1"))
    agent = (sys.executable, "-c", AGENT, "gpt-anything", "0")
    run = await agentproxy_run("--model", "openai/sim", "--api-base", sim_url, "--", *agent,
                               env=env)  # fmt: skip
    assert run.exit_code == 0, run.stderr
    assert run.stdout.splitlines() == ["You said: hello proxy", f"{run.session} sim"]


async def test_with_no_proxy_and_nothing_to_start_one_with_it_says_what_to_give(
    env: dict[str, str],
) -> None:
    run = await agentproxy_run("--port", str(free_port()), "--", "true", env=env)
    assert run.exit_code == 2
    assert all(flag in run.stderr for flag in ("--config", "--model", "--simulate")), run.stderr


async def test_a_command_not_found_is_named_and_exits_127(env: dict[str, str]) -> None:
    run = await agentproxy_run("--simulate", "--", "no-such-agent-here", env=env)
    assert run.exit_code == 127
    assert "command not found: no-such-agent-here" in run.stderr
    assert run.started_url is None  # said before anything started


async def test_a_configuration_with_keys_wants_one(env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "keys.yaml"
    config.write_text(
        "model_list: [{model_name: sim, litellm_params: {model: openai/sim, "
        "api_base: 'http://127.0.0.1:9/v1', api_key: x}}]\n"
        "keys: {api_keys: [{name: me, key: sk-mine}]}\n"
        f"server: {{port: {free_port()}}}\n"
    )
    run = await agentproxy_run("--config", str(config), "--", "true", env=env)
    assert run.exit_code == 2
    assert "--key" in run.stderr and "AGENTPROXY_API_KEY" in run.stderr


async def test_an_agent_ended_by_a_signal_exits_128_plus_it(env: dict[str, str]) -> None:
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    run = await agentproxy_run("--simulate", "--", sys.executable, "-c", kill_self, env=env)
    assert run.exit_code == 128 + signal.SIGKILL


@pytest.mark.parametrize(("sent", "code"), [(signal.SIGTERM, 7), (signal.SIGINT, 130)])
async def test_a_signal_sent_to_run_reaches_the_agent(
    env: dict[str, str], sent: signal.Signals, code: int
) -> None:
    process = await start_run("--simulate", "--", sys.executable, "-c", WAITER, env=env)
    assert process.stdout is not None and process.stderr is not None
    assert await asyncio.wait_for(process.stdout.readline(), 60) == b"ready\n"
    process.send_signal(sent)
    assert await asyncio.wait_for(process.wait(), 30) == code
    started = (await process.stderr.read()).decode()
    url = started.split("started a proxy on ")[1].split()[0]
    assert refused(url)


def test_at_a_terminal_the_agent_is_its_foreground_reads_it_and_gets_ctrl_c(
    env: dict[str, str],
) -> None:
    driven = subprocess.run(
        [sys.executable, "-c", AT_TERMINAL, COUNTER],
        env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "read typed after 1 SIGINT" in driven.stdout, driven.stdout + driven.stderr
    assert driven.stdout.rstrip().endswith("exit 5")


async def test_claude_code_is_pointed_at_the_proxy_with_the_runs_session(
    env: dict[str, str], tmp_path: Path
) -> None:
    env["PATH"] = fake_agent(tmp_path, "claude")
    env["ANTHROPIC_CUSTOM_HEADERS"] = "x-team: red"  # the user's own stay
    run = await agentproxy_run("--simulate", "--", "claude", "-p", "hi", env=env)
    assert run.exit_code == 0, run.stderr
    seen = json.loads(run.stdout)["env"]
    assert seen["ANTHROPIC_BASE_URL"] == run.started_url
    headers = seen["ANTHROPIC_CUSTOM_HEADERS"].splitlines()
    assert headers == ["x-team: red", f"x-agentproxy-session: {run.session}"]
    assert seen["ANTHROPIC_AUTH_TOKEN"]  # some key, or Claude Code asks to log in

    keyed = await agentproxy_run("--simulate", "--key", "sk-mine", "--", "claude", env=env)
    assert json.loads(keyed.stdout)["env"]["ANTHROPIC_AUTH_TOKEN"] == "sk-mine"


async def test_the_gemini_cli_is_pointed_at_the_proxy_with_the_runs_session(
    env: dict[str, str], tmp_path: Path
) -> None:
    env["PATH"] = fake_agent(tmp_path, "gemini")
    env["GEMINI_API_KEY"] = "the-users-google-key"  # never handed to the agent
    env["GEMINI_CLI_CUSTOM_HEADERS"] = "x-team: red"  # the user's own stay
    run = await agentproxy_run("--simulate", "--key", "sk-mine", "--", "gemini", env=env)
    assert run.exit_code == 0, run.stderr
    seen = json.loads(run.stdout)["env"]
    assert seen["GOOGLE_GEMINI_BASE_URL"] == run.started_url
    assert seen["GEMINI_API_KEY"] == "sk-mine"
    assert seen["GEMINI_CLI_CUSTOM_HEADERS"] == f"x-team: red,x-agentproxy-session: {run.session}"


async def test_codex_gets_a_temporary_codex_home_on_the_users_config(
    env: dict[str, str], tmp_path: Path
) -> None:
    env["PATH"] = fake_agent(tmp_path, "codex")
    user_home = tmp_path / "home" / ".codex"
    (user_home / "sessions").mkdir(parents=True)
    user_config = 'model = "gpt-sim"\nmodel_provider = "openai"\n\n[tui]\nnotifications = true\n'
    (user_home / "config.toml").write_text(user_config)
    run = await agentproxy_run("--simulate", "--key", "sk-mine", "--", "codex", env=env)
    assert run.exit_code == 0, run.stderr
    shown = json.loads(run.stdout)
    config = tomllib.loads(shown["config"])
    assert config["model"] == "gpt-sim" and config["tui"] == {"notifications": True}
    assert config["model_provider"] == "agentproxy"
    assert config["model_providers"]["agentproxy"] == {
        "name": "AgentProxy",
        "base_url": f"{run.started_url}/v1",
        "env_key": "AGENTPROXY_API_KEY",
        "wire_api": "responses",
        "request_max_retries": 0,
        "http_headers": {"x-agentproxy-session": run.session},
    }
    assert shown["env"]["AGENTPROXY_API_KEY"] == "sk-mine"
    assert shown["links"] == {"sessions": str(user_home / "sessions")}  # history kept
    assert shown["env"]["CODEX_HOME"] not in list_dir(Path(shown["env"]["CODEX_HOME"]).parent)
    assert (user_home / "config.toml").read_text() == user_config


def test_codex_config_replaces_a_provider_table_of_ours_and_keeps_the_rest() -> None:
    user = (
        'model_provider = "agentproxy"\n'
        "[model_providers.agentproxy]\n"
        'base_url = "http://old"\n'
        "[model_providers.agentproxy.http_headers]\n"
        'x = "y"\n'
        "[model_providers.other]\n"
        'name = "other"\n'
        'base_url = "http://other"\n'
    )
    config = tomllib.loads(codex_config(user, "http://127.0.0.1:4000", "run-1"))
    assert config["model_providers"]["agentproxy"]["base_url"] == "http://127.0.0.1:4000/v1"
    assert config["model_providers"]["other"]["base_url"] == "http://other"


async def test_a_codex_config_that_is_not_toml_is_left_out_and_said(
    env: dict[str, str], tmp_path: Path
) -> None:
    env["PATH"] = fake_agent(tmp_path, "codex")
    user_home = tmp_path / "home" / ".codex"
    user_home.mkdir(parents=True)
    (user_home / "config.toml").write_text("model = \n")
    run = await agentproxy_run("--simulate", "--", "codex", env=env)
    assert run.exit_code == 0, run.stderr
    assert "left out of Codex's configuration" in run.stderr
    assert tomllib.loads(json.loads(run.stdout)["config"])["model_provider"] == "agentproxy"


async def test_qwen_code_gets_system_settings_selecting_the_proxy_and_the_runs_session(
    env: dict[str, str], tmp_path: Path
) -> None:
    env["PATH"] = fake_agent(tmp_path, "qwen")
    system = tmp_path / "etc" / "settings.json"  # the user's own system settings stay
    system.parent.mkdir()
    user_settings = {
        "model": {"generationConfig": {"customHeaders": {"x-team": "red"}}},
        "general": {"disableAutoUpdate": True},
    }
    system.write_text(json.dumps(user_settings))
    env["QWEN_CODE_SYSTEM_SETTINGS_PATH"] = str(system)
    env["OPENAI_API_KEY"] = "sk-user-openai-secret"  # never handed to the agent
    run = await agentproxy_run("--simulate", "--key", "sk-mine", "--", "qwen", "-p", "hi", env=env)
    assert run.exit_code == 0, run.stderr
    shown = json.loads(run.stdout)
    seen = shown["env"]
    assert seen["OPENAI_BASE_URL"] == f"{run.started_url}/v1"
    assert seen["OPENAI_API_KEY"] == "sk-mine"
    assert seen["OPENAI_MODEL"] == "sim"  # the proxy's first model: no prompt for one
    assert seen["QWEN_CODE_SYSTEM_DEFAULTS_PATH"] == str(system.parent / "system-defaults.json")
    assert shown["qwen"] == {
        "model": {
            "generationConfig": {
                "customHeaders": {"x-team": "red", "x-agentproxy-session": run.session}
            }
        },
        "general": {"disableAutoUpdate": True},
        "security": {"auth": {"selectedType": "openai"}},  # no prompt for an auth type
    }
    ours = Path(seen["QWEN_CODE_SYSTEM_SETTINGS_PATH"]).parent
    assert not ours.exists()  # removed once Qwen Code exited
    assert json.loads(system.read_text()) == user_settings

    env["OPENAI_MODEL"] = "sim-mine"  # a model the user names wins
    system.write_text("{not json")
    mine = await agentproxy_run("--simulate", "--", "qwen", env=env)
    assert mine.exit_code == 0, mine.stderr
    assert "left out of Qwen Code's system settings" in mine.stderr
    shown = json.loads(mine.stdout)
    assert shown["env"]["OPENAI_MODEL"] == "sim-mine"
    assert shown["qwen"]["model"]["generationConfig"]["customHeaders"] == {
        "x-agentproxy-session": mine.session
    }


async def test_opencode_gets_a_provider_at_the_proxy_serving_its_models(
    env: dict[str, str], tmp_path: Path
) -> None:
    env["PATH"] = fake_agent(tmp_path, "opencode")
    env["OPENCODE_CONFIG"] = str(tmp_path / "mine.json")  # the user's own stays theirs
    env["OPENCODE_CONFIG_CONTENT"] = json.dumps(
        {"theme": "dark", "provider": {"other": {"options": {"baseURL": "http://other"}}}}
    )
    run = await agentproxy_run("--simulate", "--key", "sk-mine", "--", "opencode", env=env)
    assert run.exit_code == 0, run.stderr
    seen = json.loads(run.stdout)["env"]
    assert seen["OPENCODE_CONFIG"] == str(tmp_path / "mine.json")
    config = json.loads(seen["OPENCODE_CONFIG_CONTENT"])
    assert config["theme"] == "dark"
    assert config["provider"]["other"] == {"options": {"baseURL": "http://other"}}
    ours = config["provider"]["agentproxy"]
    assert ours["npm"] == "@ai-sdk/openai-compatible"
    assert ours["options"] == {
        "baseURL": f"{run.started_url}/v1",
        "apiKey": "sk-mine",
        "headers": {"x-agentproxy-session": run.session},
    }
    assert list(ours["models"])[:3] == ["sim", "claude", "gemini"]  # GET /v1/models
    assert ours["models"]["sim"] == {"name": "sim", "tool_call": True}
    assert config["model"] == "agentproxy/sim"


async def test_the_models_listed_to_qwen_and_opencode_are_the_keys_own(
    env: dict[str, str], tmp_path: Path
) -> None:
    env["PATH"] = fake_agent(tmp_path, "opencode")
    config = tmp_path / "keyed.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            store: {{path: {tmp_path / "state"}}}
            keys:
              api_keys:
                - {{name: narrow, key: sk-narrow, models: [second]}}
                - {{name: wide, key: sk-wide}}
            model_list:
              - model_name: first
                litellm_params: {{model: openai/a, api_base: "http://127.0.0.1:9/v1", api_key: x}}
              - model_name: second
                litellm_params: {{model: openai/b, api_base: "http://127.0.0.1:9/v1", api_key: x}}
            """
        )
    )
    seen = {}
    for key in ("sk-narrow", "sk-wide"):
        run = await agentproxy_run("--config", str(config), "--key", key, "--", "opencode", env=env)
        assert run.exit_code == 0, run.stderr
        content = json.loads(json.loads(run.stdout)["env"]["OPENCODE_CONFIG_CONTENT"])
        seen[key] = (list(content["provider"]["agentproxy"]["models"]), content["model"])
    assert seen == {
        "sk-narrow": (["second"], "agentproxy/second"),
        "sk-wide": (["first", "second"], "agentproxy/first"),
    }


# -- which proxy `run` trusts, and what the agent is given ------------------------------------

USER_KEYS = {  # the user's own provider credentials: no agent started by `run` gets them
    "OPENAI_API_KEY": "sk-user-openai-secret",
    "ANTHROPIC_API_KEY": "sk-ant-user-secret",
    "ANTHROPIC_AUTH_TOKEN": "sk-ant-user-token",
    "CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat-user",
}
# An SDK agent that also shows the environment it was started with.
ENV_AGENT = """
import json, os, openai
client = openai.OpenAI(max_retries=0)
answer = client.chat.completions.create(
    model="sim", messages=[{"role": "user", "content": "hello proxy"}])
print(answer.choices[0].message.content)
print(json.dumps(dict(os.environ)))
"""


class Squatter:
    """Another local process on the proxy's port: answers /healthz as a proxy does (and
    anything else with a chat answer), and keeps every request it got."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], bytes]] = []

    def app(self) -> web.Application:
        async def anything(request: web.Request) -> web.Response:
            self.seen.append((request.path, dict(request.headers), await request.read()))
            if request.path == "/healthz":
                return web.json_response({"status": "ok", "proof": "0" * 64})
            return web.json_response({
                "id": "x", "object": "chat.completion", "created": 0, "model": "sim",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "squatted"}}],
            })  # fmt: skip

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", anything)
        return app

    def assert_got_nothing_of_the_users(self) -> None:
        assert [path for path, _, _ in self.seen] == ["/healthz"]  # the probe, nothing else
        for _, headers, body in self.seen:
            assert not body
            shown = " ".join(headers.values())
            assert not any(secret in shown for secret in USER_KEYS.values())


@pytest.fixture
async def squatter(aiohttp_server: Any) -> tuple[Squatter, TestServer]:
    squatting = Squatter()
    server: TestServer = await aiohttp_server(squatting.app())
    return squatting, server


async def test_run_never_uses_a_process_on_the_port_that_cannot_prove_it_is_the_users_proxy(
    squatter: tuple[Squatter, TestServer], sim_server: TestServer, env: dict[str, str],
    tmp_path: Path,
) -> None:  # fmt: skip
    """`run --config` whose server.port another process holds: the configured proxy is started
    on a free port; the squatter hears only the probe, no key nor prompt. A runtime file left
    for that port (a proxy of the user's that was killed) proves nothing to it."""
    squatting, server = squatter
    identity.claim(server.port, identity.new_secret(), env)  # stale: its proxy is gone
    config = tmp_path / "on-the-squatted-port.yaml"
    sim_url = str(sim_server.make_url("")).rstrip("/")
    config.write_text(sim_config(sim_url, f"server: {{port: {server.port}}}\n"))
    env.update(USER_KEYS)
    run = await agentproxy_run("--config", str(config), "--", sys.executable, "-c", ENV_AGENT,
                               env=env)  # fmt: skip
    assert run.exit_code == 0, run.stderr
    assert f"what answers at http://127.0.0.1:{server.port} is not a proxy you started" in (
        run.stderr
    )
    assert run.started_url is not None and run.started_url.split(":")[-1] != str(server.port)
    answer, shown = run.stdout.splitlines()
    assert answer == "You said: hello proxy"  # the configured simulator, through our proxy
    seen = json.loads(shown)
    assert not set(USER_KEYS.values()) & set(seen.values())
    assert seen["OPENAI_API_KEY"] == seen["ANTHROPIC_AUTH_TOKEN"] == "agentproxy-run"
    assert "ANTHROPIC_API_KEY" not in seen and "CLAUDE_CODE_OAUTH_TOKEN" not in seen
    squatting.assert_got_nothing_of_the_users()


async def test_with_nothing_to_start_run_refuses_a_squatter_clearly(
    squatter: tuple[Squatter, TestServer], env: dict[str, str]
) -> None:
    squatting, server = squatter
    env.update(USER_KEYS)
    run = await agentproxy_run("--port", str(server.port), "--", sys.executable, "-c", ENV_AGENT,
                               env=env)  # fmt: skip
    assert run.exit_code == 2
    assert "is not a proxy you started" in run.stderr and "--config" in run.stderr
    assert run.stdout == ""  # the agent never started
    squatting.assert_got_nothing_of_the_users()


async def test_the_agent_gets_the_proxy_key_and_none_of_the_users_provider_keys(
    env: dict[str, str], tmp_path: Path
) -> None:
    env["PATH"] = fake_agent(tmp_path, "claude")
    env.update(USER_KEYS)
    keyed = await agentproxy_run("--simulate", "--key", "sk-mine", "--", "claude", env=env)
    assert keyed.exit_code == 0, keyed.stderr
    seen = json.loads(keyed.stdout)["env"]
    assert not set(USER_KEYS.values()) & set(seen.values())
    assert "ANTHROPIC_API_KEY" not in seen  # it would override the proxy key
    assert seen["OPENAI_API_KEY"] == seen["ANTHROPIC_AUTH_TOKEN"] == "sk-mine"
    assert seen["AGENTPROXY_API_KEY"] == "sk-mine"


async def test_serves_runtime_file_is_private_proves_it_to_run_and_goes_with_it(
    config_path: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """`agentproxy serve` writes its runtime file 0600 in a folder made 0700; `run` finds it
    by it and uses it; the file is gone once `serve` stopped."""
    process, url = await start_serve(config_path, env)
    port = url.rsplit(":", 1)[1]
    runtime = Path(env["XDG_RUNTIME_DIR"]) / "agentproxy"
    claimed = runtime / f"proxy-{port}.json"
    try:
        for _ in range(100):
            if claimed.exists():
                break
            await asyncio.sleep(0.05)
        assert stat.S_IMODE(claimed.stat().st_mode) == 0o600
        assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
        assert json.loads(claimed.read_text())["port"] == int(port)
        run = await agentproxy_run("--port", port, "--", sys.executable, "-c", AGENT, "sim", "0",
                                   env=env)  # fmt: skip
        assert run.exit_code == 0, run.stderr
        assert f"using the proxy running at {url}" in run.stderr and run.started_url is None
        assert run.stdout.splitlines()[0] == "You said: hello proxy"
    finally:
        process.terminate()
        await process.wait()
    assert process.returncode == 0
    assert not claimed.exists()


async def test_healthz_proves_only_over_the_port_it_is_reached_on(
    config_path: Path, env: dict[str, str]
) -> None:
    """A process relaying the challenge to a real proxy on another port gets that port's
    proof, which is not the one `run` checks."""
    async with session_noting_proxy(config_path, env) as (proxy, _):
        secret = proxy.app[IDENTITY]
        async with aiohttp.ClientSession() as http:
            async with http.get(proxy.make_url("/healthz"),
                                headers={identity.CHALLENGE_HEADER: "n1"}) as answer:  # fmt: skip
                proven = (await answer.json())["proof"]
            async with http.get(proxy.make_url("/healthz")) as answer:
                assert await answer.json() == {"status": "ok"}
        assert proven == identity.proof(secret, proxy.port, "n1")
        assert proven != identity.proof(secret, proxy.port + 1, "n1")
        assert await identity.probe(proxy.port, environ=env) == "ours"
        assert await identity.probe(proxy.port, environ={"HOME": "/nonexistent"}) == "foreign"
