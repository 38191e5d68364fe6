"""The demo runs end to end and tells the story it promises."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import signal
import sys
import time
from pathlib import Path

import aiohttp

from proxy.sim.demo import ADMIN_KEY, TASKS, run_demo

ROOT = Path(__file__).resolve().parents[2]


async def test_demo_narrates_turns_errors_and_reload() -> None:
    lines: list[str] = []
    assert await run_demo(lines.append) == 0
    text = "\n".join(lines)
    assert text.count("proxy: request") == 8  # three tool rounds, two direct answers
    assert "assistant calls list_dir" in text and "assistant calls read_file" in text
    assert "proxy applied: offload.offloaded;count=1" in text
    assert "E-4417" in text  # found again through the recall tool, inside the proxy
    assert "assistant calls agentproxy_recall" not in text  # the client never sees that call
    assert "repair.patched_dangling;count=1" in text
    assert "HTTP 404 model_not_found" in text
    assert "HTTP 502 upstream_bad_response" in text
    assert "still serving" in text
    assert "/v1/models now: sim, sim-large" in text
    # What the README says it runs: a five-turn agent, eight model calls.
    turns = re.findall(r"^Turn (\d+) ", text, flags=re.MULTILINE)
    assert turns == [str(n) for n in range(1, len(TASKS) + 2)] and len(turns) == 5
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "runs a five-turn agent" in readme and "eight model calls" in readme
    assert "Still serving" not in text  # no terminal: it ends, its addresses are not printed


async def test_on_a_terminal_the_demo_keeps_its_printed_addresses_alive_until_ctrl_c() -> None:
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "proxy", "demo"),
        cwd=ROOT, stdin=follower, stdout=follower, stderr=follower, env=env,
    )  # fmt: skip
    os.close(follower)
    shown = ""
    try:
        deadline = time.monotonic() + 120
        while "Ctrl-C stops." not in shown and time.monotonic() < deadline:
            shown += (await asyncio.to_thread(os.read, leader, 65536)).decode(errors="replace")
        assert "Ctrl-C stops." in shown, shown
        inspector = re.search(r"inspector +(http://127\.0\.0\.1:\d+)/ui", shown)
        assert inspector is not None, shown
        root = inspector.group(1)
        assert f"metrics          {root}/metrics" in shown  # printed at the start, alive now
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{root}/metrics") as response:
                assert response.status == 200
                assert "agentproxy_requests_total" in await response.text()
            async with http.get(f"{root}/ui") as response:
                assert response.status == 200
            bearer = {"Authorization": f"Bearer {ADMIN_KEY}"}
            async with http.get(f"{root}/admin/sessions", headers=bearer) as response:
                sessions = (await response.json())["data"]
        assert any(s["recorded"] and s["turns"] >= 5 for s in sessions), sessions
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        os.close(leader)
    assert "Traceback" not in shown


def test_the_demo_command_prints_its_story_not_log_lines() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "proxy", "demo"], cwd=ROOT, capture_output=True, text=True,
        timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert "reload ok=True" in out
    # The audit's JSON (the reload is audited) and INFO lines stay out of the narration.
    assert '"action":' not in out, out[-3000:]
    assert not re.search(r"^\S+ \S+ INFO ", out, flags=re.MULTILINE), out[-3000:]
