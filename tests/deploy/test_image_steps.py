"""The Dockerfile's own steps, run outside Docker (no engine on our machines): its COPYs into a
fresh build folder, its RUN (a clean virtualenv, `pip install` with the constraints and the
extras), then its CMD and HEALTHCHECK against the installed `agentproxy`, from a folder outside
the source tree: on the image's own configuration and on what docs/operations.md's `docker run`
mounts, each on a port of its own configuration (which the healthcheck finds by itself)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
EXTRAS = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http", "uvloop")


def build_stage() -> str:
    """The Dockerfile's first stage: where the package is installed."""
    return DOCKERFILE.split("\nFROM ")[1]


@pytest.fixture(scope="module")
def image_prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's /opt/agentproxy, built by the Dockerfile's own COPY and RUN lines."""
    tmp_path = tmp_path_factory.mktemp("image")
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
    return prefix


def test_the_image_installs_the_tested_pins_and_the_extras(image_prefix: Path) -> None:
    python = str(image_prefix / "bin" / "python")
    probe = (
        "import importlib.util as u, sys; sys.exit(any(not u.find_spec(m) for m in sys.argv[1:]))"
    )
    assert subprocess.run([python, "-c", probe, *EXTRAS], timeout=60).returncode == 0
    pins = dict(
        line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line
    )  # fmt: skip
    frozen = subprocess.run(
        [python, "-m", "pip", "freeze"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    installed = dict(line.split("==") for line in frozen.splitlines() if "==" in line)
    assert installed, frozen
    for name in ("aiohttp", "litellm", "opentelemetry-sdk", "uvloop", "redis", "orjson"):
        assert installed[name] == pins[name], name

    # The compose stack's configuration validates with the installed package alone.
    compose = str(ROOT / "deploy" / "agentproxy.yaml")
    checked = subprocess.run(
        [str(image_prefix / "bin" / "agentproxy"), "validate", compose],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def serve_and_probe(prefix: Path, config: Path, env: dict[str, str], cwd: Path) -> None:
    """The image's CMD (its --config swapped for `config`, its 0.0.0.0 for loopback), then its
    HEALTHCHECK, run as Docker runs it, until it passes."""
    cmd = re.search(r"^CMD (\[.+\])$", DOCKERFILE, flags=re.MULTILINE)
    health = re.search(r"^\s+CMD (python .+)$", DOCKERFILE, flags=re.MULTILINE)
    assert cmd is not None and health is not None
    args = [str(config) if a == "/etc/agentproxy" else a
            for a in json.loads(cmd.group(1))]  # fmt: skip  # the exec form is JSON
    args = ["127.0.0.1" if a == "0.0.0.0" else a for a in args]
    assert "--port" not in args  # the port is the configuration's: the healthcheck follows it
    path = f"{prefix / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"  # the image's ENV PATH
    server = subprocess.Popen(
        [str(prefix / "bin" / "agentproxy"), *args], cwd=cwd, env={**env, "PATH": path},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        probe = f"{health.group(1)} {server.pid}"  # in the image the server is PID 1
        deadline = time.monotonic() + 30
        while True:
            answered = subprocess.run(
                probe, shell=True, capture_output=True, timeout=10, env={"PATH": path}, cwd=cwd
            )
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


def on_a_free_port(source: Path, target: Path) -> Path:
    """A copy of a configuration folder (or file) whose server.port is a free one."""
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        target.mkdir()
        shutil.copy(source, target / "agentproxy.yaml")
    (target / "zz-port.yaml").write_text(f"server: {{port: {free_port()}}}\n")
    return target


def test_the_image_serves_its_own_config_on_the_configured_port(
    image_prefix: Path, tmp_path: Path
) -> None:
    own = re.search(r"^COPY (\S+) /etc/agentproxy/agentproxy.yaml$", DOCKERFILE, re.MULTILINE)
    assert own is not None
    config = on_a_free_port(ROOT / own.group(1), tmp_path / "etc")
    serve_and_probe(image_prefix, config, {}, tmp_path)


def test_the_documented_docker_run_starts_as_written(image_prefix: Path, tmp_path: Path) -> None:
    (line,) = [
        line for line in re.findall(r"^docker run .+(?:\n  .+)*", OPERATIONS, re.MULTILINE)
        if "/etc/agentproxy" in line
    ]  # fmt: skip
    argv = shlex.split(line.replace("\\\n", " ").replace("$PWD", str(ROOT)))
    assert argv[-1] == "agentproxy"  # the image, with its own CMD
    env: dict[str, str] = {}
    mounts = []
    for flag, value in itertools.pairwise(argv):
        if flag == "-e":
            name, _, given = value.partition("=")
            if given:  # `-e NAME` passes the caller's own, unset here: it must start without
                env[name] = given
        elif flag == "-v":
            mounts.append(value.split(":"))
    ((source, target, *_),) = mounts
    assert target == "/etc/agentproxy"
    config = on_a_free_port(Path(source), tmp_path / "etc")
    serve_and_probe(image_prefix, config, env, tmp_path)
