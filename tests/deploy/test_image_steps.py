"""The Dockerfile's own steps, run outside Docker (no engine on our machines): its COPYs into a
fresh build folder, its RUN (a clean virtualenv, `pip install .`), then its CMD and HEALTHCHECK
against the installed `agentproxy`, from a folder outside the source tree."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def build_stage() -> str:
    """The Dockerfile's first stage: where the package is installed."""
    return DOCKERFILE.split("\nFROM ")[1]


def test_the_image_steps_install_and_serve(tmp_path: Path) -> None:
    context, prefix = tmp_path / "src", tmp_path / "opt-agentproxy"
    context.mkdir()
    for line in build_stage().splitlines():
        if line.startswith("COPY "):
            *sources, _ = line.split()[1:]
            for source in sources:
                copy = shutil.copytree if (ROOT / source).is_dir() else shutil.copy
                copy(ROOT / source, context / source)
    (run,) = re.findall(r"^RUN (.+)$", build_stage(), flags=re.MULTILINE)
    # Our prefix for theirs, and pip's cache allowed (the image build has none to reuse).
    run = run.replace("/opt/agentproxy", str(prefix)).replace("--no-cache-dir ", "")
    run = run.replace("python -m venv", f"{shlex.quote(sys.executable)} -m venv")
    built = subprocess.run(
        run, shell=True, cwd=context, capture_output=True, text=True, timeout=900, check=False
    )
    assert built.returncode == 0, built.stderr[-3000:]
    agentproxy = prefix / "bin" / "agentproxy"

    # The compose stack's configuration validates with the installed package alone.
    checked = subprocess.run(
        [str(agentproxy), "validate", str(ROOT / "deploy" / "agentproxy.yaml")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # CMD (on a free port, the image's own config) and then HEALTHCHECK against it.
    cmd = re.search(r"^CMD (\[.+\])$", DOCKERFILE, flags=re.MULTILINE)
    health = re.search(r"^\s+CMD (python -c .+)$", DOCKERFILE, flags=re.MULTILINE)
    assert cmd is not None and health is not None
    port = free_port()
    args = [str(ROOT / "policies" / "local.yaml") if a == "/etc/agentproxy" else a
            for a in json.loads(cmd.group(1))]  # fmt: skip  # the exec form is JSON
    args = [str(port) if a == "4000" else "127.0.0.1" if a == "0.0.0.0" else a for a in args]
    server = subprocess.Popen(
        [str(agentproxy), *args], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        probe = health.group(1).replace("127.0.0.1:4000", f"127.0.0.1:{port}")
        probe = probe.replace("python ", f"{prefix / 'bin' / 'python'} ", 1)
        deadline = time.monotonic() + 30
        while True:
            answered = subprocess.run(probe, shell=True, capture_output=True, timeout=10)
            if answered.returncode == 0:
                break
            assert server.poll() is None, server.stderr.read() if server.stderr else b""
            assert time.monotonic() < deadline, answered.stderr
            time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(10)
        if server.stderr is not None:
            server.stderr.close()
