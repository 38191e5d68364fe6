"""The image's healthcheck finds the port a real `agentproxy serve` listens on by itself (from
the kernel's socket tables) and probes /healthz there; a process with no port fails it."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from tests.conftest import sim_config
from tests.test_cli import ROOT, start_serve


async def healthcheck(pid: int) -> int:
    probe = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "proxy.runtime.healthcheck", str(pid)),
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return await asyncio.wait_for(probe.wait(), timeout=30)


async def test_the_healthcheck_follows_the_port_served(tmp_path: Path) -> None:
    config = tmp_path / "agentproxy.yaml"
    config.write_text(sim_config("http://127.0.0.1:9911"))
    process, _ = await start_serve(config)  # on a free port, which the probe is not told
    try:
        assert await healthcheck(process.pid) == 0
        assert await healthcheck(os.getpid()) == 1  # this test listens on nothing
    finally:
        process.terminate()
        await process.wait()
