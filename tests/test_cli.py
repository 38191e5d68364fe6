"""The console commands as a user runs them: real processes, real ports, real signals."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from proxy import cli
from proxy.sim.simulator import Simulator
from tests.conftest import free_port, sim_config
from tests.routes.test_client_gone import stalled_stream
from tests.upstream.hostile import COMPLETION_HEAD, endless, hostile_app

ROOT = Path(__file__).resolve().parent.parent


def agentproxy(*args: str, **options: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **options,  # type: ignore[call-overload]
    )


def test_validate_accepts_a_good_file_and_names_errors_in_a_bad_one(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(sim_config("http://127.0.0.1:9911"))
    assert agentproxy("validate", str(good)).returncode == 0

    bad = tmp_path / "bad.yaml"
    bad.write_text(sim_config("http://127.0.0.1:9911").replace("openai/sim", "openai/"))
    result = agentproxy("validate", str(bad))
    assert result.returncode == 1
    assert f"{bad}:4: model_list[0].litellm_params.model" in result.stderr


# An installation without the extras (`pip install .`): their modules cannot be imported.
WITHOUT_EXTRAS = """\
import sys
from proxy import cli
for name in ("opentelemetry", "opentelemetry.sdk", "opentelemetry.exporter", "uvloop"):
    sys.modules[name] = None
sys.exit(cli.main(sys.argv[1:]))
"""


def test_validate_refuses_what_serve_refuses_without_the_extras(tmp_path: Path) -> None:
    config = tmp_path / "agentproxy.yaml"
    extras = "tracing: {enabled: true}\nserver: {event_loop: uvloop}\n"
    config.write_text(sim_config("http://127.0.0.1:9911") + extras)
    run = [sys.executable, "-c", WITHOUT_EXTRAS]
    served = subprocess.run([*run, "serve", "--config", str(config), "--port",
                             str(free_port())], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, check=False)  # fmt: skip
    checked = subprocess.run([*run, "validate", str(config)], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, check=False)  # fmt: skip
    assert served.returncode == 2 and checked.returncode == 1, served.stderr + checked.stderr
    for refused in ("pip install 'agentproxy[otel]'", "pip install 'agentproxy[speed]'"):
        assert refused in served.stderr and f"error: {config}: " in checked.stderr
        assert refused in checked.stderr
    assert "configuration rejected" in checked.stderr


def test_serve_refuses_an_invalid_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_list: [{model_name: x}]\n")
    result = agentproxy("serve", "--config", str(bad), "--port", str(free_port()))
    assert result.returncode == 2
    assert "model_list[0]" in result.stderr and "litellm_params" in result.stderr


async def start_serve(
    config: Path, env: Mapping[str, str] | None = None
) -> tuple[asyncio.subprocess.Process, str]:
    """`agentproxy serve` as deployed, on a free port, once it is ready; `env`: its
    environment (else this process's)."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)),
        cwd=ROOT,
        env=None if env is None else {**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, deadline=15, process=process)
    except BaseException:
        process.terminate()
        await process.wait()
        raise
    return process, url


async def wait_ready(
    url: str, deadline: float, process: asyncio.subprocess.Process | None = None
) -> float:
    started = time.perf_counter()
    async with aiohttp.ClientSession() as http:
        while time.perf_counter() - started < deadline:
            if process is not None and process.returncode is not None:
                break
            try:
                async with http.get(url + "/readyz") as r:
                    if r.status == 200:
                        return time.perf_counter() - started
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.02)
    raise AssertionError(f"{url} not ready within {deadline}s")


async def test_serve_answers_and_reloads_on_sighup(tmp_path: Path, simulator: str) -> None:
    config = tmp_path / "agentproxy.yaml"
    config.write_text(sim_config(simulator) + "server:\n  watch_interval_s: 3600\n")
    process, url = await start_serve(config)
    try:
        async with aiohttp.ClientSession() as http:
            body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                assert (await r.json())["choices"][0]["message"]["content"] == "You said: hi"
            config.write_text(sim_config(simulator, more_models=("sim-two",)))
            process.send_signal(signal.SIGHUP)
            for _ in range(100):
                await asyncio.sleep(0.05)
                async with http.get(url + "/v1/models") as r:
                    if len((await r.json())["data"]) == 2:
                        break
            else:
                raise AssertionError("SIGHUP did not reload the configuration")
    finally:
        process.terminate()
        _, raw_stderr = await asyncio.wait_for(process.communicate(), timeout=10)
    stderr = raw_stderr.decode()
    assert process.returncode == 0, stderr
    assert "loaded (sighup)" in stderr
    assert "LOOPBACK CLIENTS ONLY" in stderr


def test_demo_against_a_proxy_that_is_not_there_says_so() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = agentproxy("demo", "--proxy", url)
    assert result.returncode == 1
    assert f"agentproxy demo: no proxy answers at {url}" in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_warns_like_serve_about_a_public_address_without_keys(tmp_path: Path) -> None:
    config = tmp_path / "open.yaml"
    config.write_text(sim_config("http://127.0.0.1:9911") + "server: {host: 0.0.0.0}\n")
    result = agentproxy("validate", str(config))
    assert result.returncode == 0 and f"ok: {config}" in result.stdout
    assert "warning: !!! no API keys configured (keys.api_keys): serving LOOPBACK CLIENTS ONLY" in (
        result.stdout
    )
    assert "'0.0.0.0' is not a loopback address" in result.stdout
    assert "reverse proxy" in result.stdout


def test_validate_hides_credentials_of_a_bad_api_base(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    secret_url = "htp://u:hunter2@127.0.0.1/v1?api-key=k-secret"
    config.write_text(
        sim_config("http://127.0.0.1:9911").replace("http://127.0.0.1:9911/v1", secret_url)
    )
    result = agentproxy("validate", str(config))
    assert result.returncode == 1
    assert "'htp://***@127.0.0.1/v1?api-key=***' is not an http(s) URL" in result.stderr
    assert "hunter2" not in result.stderr and "k-secret" not in result.stderr


def test_serve_refuses_a_store_it_cannot_write(tmp_path: Path) -> None:
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("not a directory")  # ENOTDIR even for root, unlike chmod
    config = tmp_path / "agentproxy.yaml"
    config.write_text(sim_config("http://127.0.0.1:9911") + f"store: {{path: {in_the_way}/data}}\n")
    result = agentproxy("serve", "--config", str(config), "--port", str(free_port()))
    assert result.returncode == 2, result.stderr
    assert "agentproxy: the store (store.backend: local) is not writable" in result.stderr
    assert "Not a directory" in result.stderr and "not starting" in result.stderr
    assert "Traceback" not in result.stderr


# A client that hangs up stops the upstream call it was waiting on. The in-process test server
# always cancels a handler whose client left; run_app does so only when asked.
async def test_a_client_hanging_up_stops_the_upstream_call(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    drip_app, drip = hostile_app(endless(COMPLETION_HEAD, b"a", pause_s=0.05), "application/json")
    stall_app, stall = hostile_app(stalled_stream(), "text/event-stream")
    urls = {
        "drip": str((await aiohttp_server(drip_app)).make_url("")).rstrip("/"),
        "stall": str((await aiohttp_server(stall_app)).make_url("")).rstrip("/"),
    }
    config = tmp_path / "agentproxy.yaml"
    lines = [f"store: {{path: {tmp_path / 'state'}}}", "model_list:"]
    for alias, base in urls.items():
        lines += [
            f"  - model_name: {alias}",
            "    litellm_params:",
            f"      model: openai/{alias}",
            f"      api_base: {base}/v1",
        ]
    config.write_text("\n".join(lines) + "\n")
    process, url = await start_serve(config)
    try:
        ask = {"messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as http:
            # A non-streaming call to an upstream that drips: the client gives up waiting.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(
                    http.post(url + "/v1/chat/completions", json={**ask, "model": "drip"}), 0.5
                )
            await asyncio.wait_for(drip.hung_up.wait(), 2)
            # A stream whose upstream went quiet: the client hangs up after two events.
            response = await http.post(
                url + "/v1/chat/completions", json={**ask, "model": "stall", "stream": True}
            )
            for _ in range(2):
                await response.content.readuntil(b"\n\n")
            response.close()
            await asyncio.wait_for(stall.hung_up.wait(), 2)
    finally:
        if process.returncode is None:
            process.terminate()
        _, stderr = await asyncio.wait_for(process.communicate(), 10)
    assert process.returncode in (0, -15), stderr.decode()


# --- help, flags, and serving one model without a file ----------------------------------------


def _every_parser(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _every_parser(sub)


def test_every_command_and_flag_has_help() -> None:
    undocumented = [
        f"{prog} {'/'.join(action.option_strings) or action.dest}"
        for prog, parser in _every_parser(cli._parser())
        for action in parser._actions
        if not action.help or action.help == argparse.SUPPRESS
    ]
    assert undocumented == []
    subcommands = next(
        a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    assert all(choice.help for choice in subcommands._choices_actions)


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["serve", "--config", "x", "--log-level", "debug"], "debug"),
        (["--log-level", "debug", "serve", "--config", "x"], "debug"),
        (["--log-level", "error", "validate", "x"], "error"),  # not reset by the command
        (["validate", "x"], "info"),
        (["simulate", "--log-level", "warning"], "warning"),
    ],
)
def test_global_flags_go_before_or_after_the_command(argv: list[str], level: str) -> None:
    assert cli._parser().parse_args(argv).log_level == level


def test_a_global_flag_after_the_command_runs(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(sim_config("http://127.0.0.1:9911"))
    result = agentproxy("validate", str(good), "--log-level", "debug")
    assert result.returncode == 0, result.stderr


def test_serve_wants_a_config_or_a_model() -> None:
    result = agentproxy("serve")
    assert result.returncode == 2 and "one of the arguments --config --model is required" in (
        result.stderr
    )
    result = agentproxy("serve", "--config", "x.yaml", "--api-base", "http://127.0.0.1:1/v1")
    assert result.returncode == 2 and "--api-base goes with --model" in result.stderr


async def test_serve_one_model_with_no_file(aiohttp_server: Any, tmp_path: Path) -> None:
    sim = Simulator(api_key="sk-from-the-environment")
    upstream = str((await aiohttp_server(sim.app())).make_url("/v1"))
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "proxy", "serve", "--model", "openai/gpt-4o-mini"),
        *("--api-base", upstream, "--port", str(port)),
        cwd=tmp_path,
        env={**os.environ, "OPENAI_API_KEY": "sk-from-the-environment", "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, deadline=15, process=process)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="anything", max_retries=0)
        hi: Any = [{"role": "user", "content": "hi"}]
        for name in ("gpt-4o-mini", "openai/gpt-4o-mini", "gpt-4"):  # any name is served
            raw = await client.chat.completions.with_raw_response.create(model=name, messages=hi)
            assert raw.headers["x-agentproxy-model"] == "gpt-4o-mini"
            assert raw.parse().choices[0].message.content == "You said: hi"
        assert [r.body["model"] for r in sim.requests] == ["gpt-4o-mini"] * 3
        assert {r.api_key for r in sim.requests} == {"sk-from-the-environment"}
        assert [m.id async for m in client.models.list()] == ["gpt-4o-mini"]
        process.send_signal(signal.SIGHUP)  # nothing to reload: said, and still serving
        await asyncio.sleep(0.2)
        await client.chat.completions.create(model="gpt-4o-mini", messages=hi)
    finally:
        process.terminate()
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=10)
    assert process.returncode == 0, stderr.decode()
    assert (
        f"on http://127.0.0.1:{port}/v1 (model openai/gpt-4o-mini, as 'gpt-4o-mini' and any "
        "other name)"
    ) in stdout.decode()
    assert "started with --model: there is no file to load" in stderr.decode()
    assert "provider key from OPENAI_API_KEY" in stderr.decode()


@pytest.mark.parametrize("command", ["serve", "simulate", "run"])
def test_a_port_in_use_is_one_line_naming_it_and_how_to_pick_another(
    tmp_path: Path, command: str
) -> None:
    config = tmp_path / "agentproxy.yaml"
    config.write_text(sim_config("http://127.0.0.1:9911") + f"store: {{path: {tmp_path}/data}}\n")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        flags = {"serve": ["--config", str(config)], "run": ["--simulate"]}.get(command, [])
        agent = ["--", "true"] if command == "run" else []  # `run` starts its proxy on --port
        result = agentproxy(command, *flags, "--port", str(port), *agent)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [text for text in result.stderr.splitlines() if str(port) in text]
    assert f"127.0.0.1:{port} is in use" in line and "--port N" in line, line
    assert line == result.stderr.splitlines()[-1]
    assert line.endswith("not starting") or line.startswith("agentproxy run: cannot start"), line
