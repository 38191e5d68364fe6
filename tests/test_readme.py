"""The README's snippets work when pasted: each runs against a real proxy serving
policies/local.yaml (its simulator and proxy ports swapped for this test's free ones)."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import sys
import tomllib
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.clients.conftest import ClaudeCode, _installed_claude
from tests.conftest import ProxyFactory, free_port

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", README, flags=re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [code for lang, code in BLOCKS if lang == language]


@pytest.fixture
def sim() -> Simulator:
    return Simulator()  # as `agentproxy simulate` runs it: no upstream key


@pytest.fixture
async def local_proxy(
    sim_server: TestServer, start_proxy: ProxyFactory, tmp_path: Path
) -> TestServer:
    sim_url = str(sim_server.make_url("")).rstrip("/")
    local = (ROOT / "policies" / "local.yaml").read_text()
    assert "http://127.0.0.1:9911" in local  # what the README's `simulate --port 9911` serves
    path = tmp_path / "local.yaml"
    path.write_text(local.replace("http://127.0.0.1:9911", sim_url))
    return await start_proxy(path)


async def run(*argv: str, **env: str) -> tuple[int, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=ROOT,
        env={**clean, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


def test_the_readme_has_the_snippets_this_file_runs() -> None:
    assert len(blocks("python")) == 1 and len(blocks("toml")) == 1
    assert any("agentproxy validate" in code for code in blocks("sh"))


async def test_the_python_snippet_runs_against_local_yaml(local_proxy: TestServer) -> None:
    (code,) = blocks("python")
    address = f"127.0.0.1:{local_proxy.port}"
    returncode, output = await run(sys.executable, "-c", code.replace("127.0.0.1:4000", address))
    assert returncode == 0, output

    # What the README's inspector picture shows: local.yaml records every session whole, and
    # the simulator's models have no price, so their cost is unknown (null, a dash), not $0.
    async with aiohttp.ClientSession(f"http://{address}") as http:
        async with http.get("/admin/sessions") as response:
            sessions = (await response.json())["data"]
        assert sessions and all(s["recorded"] and s["cost_usd"] is None for s in sessions)
        async with http.get(f"/admin/sessions/{sessions[0]['id']}") as response:
            shown = await response.json()
    assert shown["source"] == "recording" and shown["timeline"], shown


async def run_readme_line(command: str) -> tuple[int, str]:
    """The README's sh line running `agentproxy <command>`, run as written from the checkout."""
    line = next(
        line
        for code in blocks("sh")
        for line in code.splitlines()
        if f"agentproxy {command}" in line
    )
    argv = line.split("#")[0].split()
    assert argv[0] == ".venv/bin/agentproxy"
    return await run(str(Path(sys.executable).parent / "agentproxy"), *argv[1:])


async def test_the_validate_line_passes_on_a_fresh_clone() -> None:
    returncode, output = await run_readme_line("validate")
    assert returncode == 0, output


async def test_the_replay_line_runs_on_a_fresh_clone() -> None:
    returncode, output = await run_readme_line("replay")
    assert returncode == 0, output
    assert "every request valid" in output


def test_the_codex_provider_points_at_the_responses_route() -> None:
    (code,) = blocks("toml")
    config: dict[str, Any] = tomllib.loads(code)
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:4000/v1"
    assert provider["wire_api"] == "responses"
    assert config["model"] in (ROOT / "policies" / "local.yaml").read_text()
    assert "AGENTPROXY_KEY=" in README  # the snippet names the variable it reads


# --- "Run it", top to bottom ------------------------------------------------------------------

RUN_IT_PORTS = {"9911": "simulator", "4000": "proxy", "4001": "second proxy"}


def run_it_lines() -> list[tuple[list[str], bool]]:
    """The "Run it" block's lines as argv, each with whether it ends in `&` (runs on)."""
    (code,) = [code for code in blocks("sh") if "agentproxy simulate" in code]
    lines = []
    for line in code.splitlines():
        words = shlex.split(line.split("  #")[0])
        background = words[-1:] == ["&"]
        lines.append((words[:-1] if background else words, background))
    return lines


def a_clone(tmp_path: Path, ports: dict[str, int]) -> Path:
    """A folder laid out as the checkout for the README's relative paths (.venv/bin/agentproxy,
    policies/, examples/), its policies' ports swapped for this test's free ones."""
    clone = tmp_path / "clone"
    (clone / ".venv" / "bin").mkdir(parents=True)
    (clone / ".venv" / "bin" / "agentproxy").symlink_to(Path(sys.executable).parent / "agentproxy")
    (clone / "examples").symlink_to(ROOT / "examples")
    (clone / "policies").mkdir()
    for path in (ROOT / "policies").iterdir():
        text = path.read_text().replace("127.0.0.1:9911", f"127.0.0.1:{ports['9911']}")
        if path.name == "local.yaml":
            assert "server:" not in text  # so the proxy is on 4000, as the README says
            text += f"\nserver: {{port: {ports['4000']}}}\n"
        (clone / "policies" / path.name).write_text(text)
    return clone


class Running:
    """A line that runs on (`&`): its output read as it comes, so its pipe never fills."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process, self.output = process, ""
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            self.output += line.decode(errors="replace")

    async def says(self, text: str) -> None:
        for _ in range(1500):
            if text in self.output:
                return
            assert self.process.returncode is None, self.output
            await asyncio.sleep(0.02)
        raise AssertionError(f"never said {text!r}:\n{self.output}")

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
        await asyncio.wait_for(self.process.wait(), 30)
        await self.reader


async def test_the_run_it_block_runs_top_to_bottom_as_written(tmp_path: Path) -> None:
    ports = {written: free_port() for written in RUN_IT_PORTS}
    clone = a_clone(tmp_path, ports)
    claude, why_not = _installed_claude()
    bin_dir = tmp_path / "bin"  # `claude` on PATH, as the README's reader has it
    bin_dir.mkdir()
    if claude is not None:
        (bin_dir / "claude").symlink_to(claude)
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True)
    sealed = ClaudeCode(claude or Path("claude"), clone, home).environment(
        "http://127.0.0.1:1", "unused"
    )
    env = {**sealed, "PATH": f"{bin_dir}:{sealed['PATH']}", "PYTHONPATH": str(ROOT)}
    del env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"]  # `run` sets what the agent needs
    running: list[Running] = []
    seen: dict[str, str] = {}
    try:
        for argv, background in run_it_lines():
            argv = [ports.get(word, word) if isinstance(word, str) else word for word in argv]
            argv = [str(word) for word in argv]
            command = argv[argv.index(".venv/bin/agentproxy") + 1]
            if command == "run" and claude is None:
                continue  # said at the end
            process = await asyncio.create_subprocess_exec(
                *argv, cwd=clone, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            line = Running(process)
            if command == "simulate":
                running.append(line)
                await line.says(f"simulated upstream on http://127.0.0.1:{ports['9911']}/v1")
            elif command == "serve":  # the last line runs in the foreground: stopped here
                running.append(line)
                port = ports["4000"] if background else ports["4001"]
                root = f"http://127.0.0.1:{port}"
                await line.says(f"inspector {root}/ui   metrics {root}/metrics")
                async with aiohttp.ClientSession() as http:
                    for path in ("/ui", "/metrics"):  # alive while the banner is true
                        async with http.get(root + path) as response:
                            assert response.status == 200, path
                if not background:
                    await line.stop()
            else:
                await asyncio.wait_for(process.wait(), 300)
                await line.reader
                assert process.returncode == 0, line.output
                seen[command] = line.output
        assert "ok: policies/" in seen["validate"]
        assert "every request valid" in seen["replay"]
        if claude is None:
            pytest.skip(f"every line ran but the agent's: {why_not}")
        proxy = f"http://127.0.0.1:{ports['4000']}"
        assert f"using the proxy running at {proxy}" in seen["run"], seen["run"]
        name = re.search(r"#session=(run-[0-9a-f]{12})", seen["run"])
        assert name is not None, seen["run"]
        async with aiohttp.ClientSession() as http:  # the inspector's list, as the README shows it
            async with http.get(f"{proxy}/admin/sessions") as response:
                sessions = (await response.json())["data"]
        (session,) = [s for s in sessions if s["session"] == name.group(1)]
        assert session["recorded"] and session["turns"] >= 1 and session["cost_usd"] is None
    finally:
        for line in reversed(running):
            await line.stop()
    for line in running:  # the serve lines said their port and stopped cleanly, no traceback
        assert "Traceback" not in line.output, line.output
