"""The README's snippets work when pasted: each runs against a real proxy serving
policies/local.yaml (its simulator and proxy ports swapped for this test's free ones)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory

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
