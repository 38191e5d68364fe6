"""What `pip install .` and the Dockerfile produce, checked without a Docker engine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_installed_package_validates_the_docker_config(tmp_path: Path) -> None:
    """The built package carries its schema, and runs from outside the source tree."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
         str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    assert (target / "proxy" / "policies" / "config.schema.json").is_file()
    for name in ("index.html", "inspector.js", "inspector.css", "favicon.svg"):  # /ui
        assert (target / "proxy" / "ui" / name).is_file(), name
    paths = [str(target)] + [p for p in sys.path if p and Path(p).resolve() != ROOT]
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "validate", str(ROOT / "policies" / "local.yaml")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (
        str(target)
        in subprocess.run(
            [sys.executable, "-c", "import proxy; print(proxy.__file__)"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )


def test_dockerfile_runs_as_non_root_with_a_healthcheck() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert users and users[-1] not in {"root", "0"}
    # /healthz on the port the proxy listens on (proxy/runtime/healthcheck.py)
    assert re.search(
        r"^HEALTHCHECK .*\n?.*CMD python -m proxy.runtime.healthcheck$", dockerfile, re.M
    )
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.M):
        for name in source.split():
            assert (ROOT / name).exists(), f"Dockerfile copies missing {name}"
    # The README's install path, with CI's pins and the extras.
    assert "pip install --no-cache-dir -c constraints.txt '.[otel,speed]'" in dockerfile
