"""`agentproxy run -- claude|codex|gemini|qwen|opencode|CMD ...`: an agent started already
pointed at the proxy.

The proxy is the one this user's `serve` runs on 127.0.0.1 at --port (else the
configuration's server.port, else 4000), proven by the challenge of its runtime file
(proxy/runtime/identity.py); or, when there is none (something else answering there is never
used; --model / --simulate always ask for one), one embedded in this process: on --port if
given and free, else on a free port, with the configuration's policies (--config, --model as
`serve --model` does, or --simulate: the built-in simulated model, offline). It lives as long
as the agent, its log in its store's folder. The agent gets a fresh session id and the proxy
key, never the user's provider keys (agent_env.py), and the inspector's address for it is
printed before it starts; once it exits, the session's figures and, for a recorded one, the
`agentproxy replay` line that replays it (run_report.py).

--simulate keeps its store, log and configuration in the user's state folder, every session
recorded (run_simulated.py), so a session replays after the proxy stopped.

The agent runs in this process group, on this terminal: a key pressed there (Ctrl-C) reaches
it directly, so SIGINT and SIGQUIT are forwarded only when this process is not the terminal's
foreground (someone sent them to this process alone); SIGTERM and SIGHUP always are. The exit
code is the agent's (128 + N when a signal N ended it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from proxy.policies.spec import Config
from proxy.runtime.agent_env import (
    KEY_VARIABLE,
    NOTHING_SENT,
    agent_environment,
    agent_kind,
    command_path,
    make_codex_home,
    make_qwen_settings,
    opencode_environment,
    qwen_model,
)
from proxy.runtime.run_report import replay_line, session_figures
from proxy.runtime.run_simulated import (
    SIM_WINDOW,
    alias_asked_models,
    simulate_config_path,
    simulated_config,
)

DEFAULT_PORT = 4000
HOST = "127.0.0.1"
USAGE = 2
NOT_FOUND = 127
MODELS_TIMEOUT_S = 10.0
FORWARDED_ALWAYS = (signal.SIGTERM, signal.SIGHUP)
FROM_TERMINAL = (signal.SIGINT, signal.SIGQUIT)

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RunOptions:
    command: Sequence[str]
    config: str | None = None
    model: str | None = None
    api_base: str | None = None
    simulate: bool = False
    port: int | None = None
    key: str | None = None


def say_on_stderr(line: str) -> None:
    print(f"agentproxy run: {line}", file=sys.stderr, flush=True)


def run_agent(
    options: RunOptions, environ: Mapping[str, str] = os.environ, say: Say = say_on_stderr
) -> int:
    """Start the agent (and the proxy when none runs); the agent's exit code."""
    if not options.command:
        say("name the agent to start after --, e.g. agentproxy run -- claude")
        return USAGE
    if command_path(options.command[0], environ) is None:
        say(f"command not found: {options.command[0]} (not on PATH, or not executable)")
        return NOT_FOUND
    if sum((options.config is not None, options.model is not None, options.simulate)) > 1:
        say("--config, --model and --simulate each say where the model is: give one")
        return USAGE
    from proxy.policies.loader import ConfigError, load_config
    from proxy.policies.single_model import single_model_config

    try:
        config = (
            single_model_config(options.model, options.api_base)
            if options.model
            else load_config(options.config)
            if options.config
            else None
        )
    except ConfigError as exc:
        say(f"invalid configuration:\n{exc}")
        return USAGE
    key = options.key or environ.get("AGENTPROXY_API_KEY") or None
    if options.config:  # as the replay line names it, wherever it is run from
        options = dataclasses.replace(options, config=os.path.abspath(options.config))
    return asyncio.run(_run(options, config, key, environ, say))


async def _run(
    options: RunOptions, config: Config | None, key: str | None, environ: Mapping[str, str],
    say: Say,
) -> int:  # fmt: skip
    kind = agent_kind(options.command[0])
    session = f"run-{uuid.uuid4().hex[:12]}"
    async with contextlib.AsyncExitStack() as stack:
        proxy_url = await _find_or_start(options, config, key, kind, environ, stack, say)
        if proxy_url is None:
            return USAGE
        env = agent_environment(environ, proxy_url, session, key)
        if kind == "codex":
            home = make_codex_home(environ, proxy_url, session, say)
            stack.callback(shutil.rmtree, home, ignore_errors=True)
            env["CODEX_HOME"] = str(home)
        if kind == "qwen":
            folder, settings = make_qwen_settings(environ, session, say)
            stack.callback(shutil.rmtree, folder, ignore_errors=True)
            env.update(settings, **qwen_model(environ, await proxy_models(proxy_url, key)))
        if kind == "opencode":
            models = await proxy_models(proxy_url, key)
            proxy_key = env[KEY_VARIABLE]
            env.update(opencode_environment(environ, proxy_url, session, proxy_key, models, say))
        inspector = f"{proxy_url}/ui#session={session}"
        if kind == "other":  # an SDK sends no header of ours by itself
            inspector += " (if it sends x-agentproxy-session: $AGENTPROXY_SESSION)"
        say(f"session {session}: {inspector}")
        code = await launch(options.command, env)
        figures = await session_figures(proxy_url, session, key)
    # The embedded proxy has stopped: its recording is written.
    if figures is None:
        say(f"session {session}: no request of it reached the proxy")
        if hint := NOTHING_SENT.get(kind):
            say(hint)
        return code
    say(figures.line(session))
    if not figures.recorded:
        return code
    if options.simulate:
        replayable = simulate_config_path(environ)
        await alias_asked_models(replayable, session)
    else:  # the proxy's own configuration, when run was told it
        replayable = options.config or "CONFIG"
    said = replay_line(session, replayable)
    if not options.config and not options.simulate:
        said += " (CONFIG: the configuration the proxy runs with)"
    say(f"replay it: {said}")
    return code


async def proxy_models(proxy_url: str, key: str | None) -> list[str]:
    """The aliases the proxy serves this key (GET /v1/models, in its configuration's order);
    none when it cannot be asked."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    timeout = aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout, headers=headers) as http,
            http.get(f"{proxy_url}/v1/models") as response,
        ):
            response.raise_for_status()
            listed = await response.json()
        return [str(model["id"]) for model in listed.get("data") or []]
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError, AttributeError):
        return []


async def _find_or_start(
    options: RunOptions, config: Config | None, key: str | None, kind: str,
    environ: Mapping[str, str], stack: contextlib.AsyncExitStack, say: Say,
) -> str | None:  # fmt: skip
    """The URL of the proxy the agent is to use (one started lives as long as `stack`), or
    None when there is none to use, said why. A process on the port that cannot prove it is
    a proxy this user started (proxy/runtime/identity.py) is never used: one is started on a
    free port instead."""
    from proxy.runtime.identity import probe, runtime_dir
    from proxy.store.base import StoreError

    port = options.port or (config.server.port if config else DEFAULT_PORT)
    running = f"http://{HOST}:{port}"
    found = "none"
    if not (options.simulate or options.model):
        found = await probe(port, HOST, environ)
        if found == "ours":
            say(f"using the proxy running at {running}")
            return running
        if found == "foreign":
            say(
                f"what answers at {running} is not a proxy you started (it cannot answer the "
                f"challenge of the runtime file in {runtime_dir(environ)}): not using it"
            )
    if config is None and not options.simulate:
        say(
            f"no proxy of yours answers at {running}, and none to start: give --config PATH "
            "(your configuration: model_list with your providers), --model "
            "PROVIDER/NAME (one model, its key from the environment, e.g. "
            "--model anthropic/claude-sonnet-4-5), or --simulate (the built-in "
            "simulated model, offline); or run `agentproxy serve` and give its --port"
        )
        return None
    if config is not None and config.keys.api_keys and key is None:
        say("this configuration sets keys.api_keys: give one with --key or AGENTPROXY_API_KEY")
        return None
    listen = 0 if found == "foreign" else options.port or 0  # the port is taken
    embedded = _embedded(config, options, listen, kind, environ, say)
    try:
        url: str = await stack.enter_async_context(embedded)
    except (OSError, StoreError) as exc:
        say(f"cannot start the proxy: {exc}")
        return None
    return url


@contextlib.asynccontextmanager
async def _embedded(
    config: Config | None, options: RunOptions, port: int, kind: str,
    environ: Mapping[str, str], say: Say,
) -> AsyncIterator[str]:  # fmt: skip
    """The proxy in this process (and with --simulate the simulator) on `port` (0: a free
    one), until the agent is done; yields its URL."""
    from proxy.app import build_app
    from proxy.runtime.head_deadline import ProxyRunner
    from proxy.runtime.listen import start_site
    from proxy.sim.simulator import Simulator, run_simulator

    async with contextlib.AsyncExitStack() as stack:
        if config is None:  # --simulate
            sim = Simulator(context_window=SIM_WINDOW, record=False)
            sim_url = await stack.enter_async_context(run_simulator(sim))
            config = simulated_config(sim_url, simulate_config_path(environ), kind)
        _log_to_file(config.store.path, say)
        app = build_app(options.config, config=config, host=HOST)
        runner = ProxyRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, HOST, port)
        await start_site(site, HOST, port, "pick another with --port N, or leave --port out")
        port = runner.addresses[0][1]
        what = "the simulated model" if options.simulate else (
            f"model {options.model}" if options.model else f"config {options.config}"
        )  # fmt: skip
        say(f"started a proxy on http://{HOST}:{port} ({what}); it stops with the agent")
        yield f"http://{HOST}:{port}"


def _log_to_file(folder: str, say: Say) -> None:
    """The embedded proxy's log lines would land in the agent's terminal: a file in its
    store's folder takes them."""
    from proxy.store.files import private_dir, private_file

    path = Path(folder).resolve() / "run.log"
    private_dir(path.parent)
    private_file(path)  # what the proxy logs is its user's alone
    handler = logging.FileHandler(path)
    root = logging.getLogger()
    if root.handlers:
        handler.setFormatter(root.handlers[0].formatter)
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    say(f"the proxy's log: {path}")


async def launch(command: Sequence[str], env: dict[str, str]) -> int:
    """Run the agent on this terminal until it exits, forwarding the signals that would not
    reach it otherwise; its exit code (128 + N when signal N ended it). The handlers are in
    place before the agent starts: a Ctrl-C it gets at once must not end this process (and
    the proxy) under it."""
    loop = asyncio.get_running_loop()
    early: list[signal.Signals] = []  # came while the agent was starting
    process: asyncio.subprocess.Process | None = None

    def forward(sig: signal.Signals) -> None:
        if sig in FROM_TERMINAL and _terminal_foreground():
            return  # the terminal sent it to the agent as well
        if process is None:
            early.append(sig)
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)

    handled = (*FORWARDED_ALWAYS, *FROM_TERMINAL)
    for sig in handled:
        loop.add_signal_handler(sig, forward, sig)
    try:
        process = await asyncio.create_subprocess_exec(*command, env=env)
        for sig in early:
            forward(sig)
        code = await process.wait()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
    return code if code >= 0 else 128 - code


def _terminal_foreground() -> bool:
    """Whether this process group is its terminal's foreground: a key like Ctrl-C then
    signals the whole group, the agent too."""
    try:
        tty = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(tty) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(tty)
