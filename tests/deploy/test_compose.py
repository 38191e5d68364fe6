"""compose.yaml and the files it mounts, checked without a Docker engine."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
SERVICES = {"agentproxy", "simulator", "redis", "prometheus", "grafana"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def binds(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts (short or long syntax)."""
    found: dict[str, Path] = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                found[volume["target"]] = ROOT / volume["source"]
            continue
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/", "~")):  # else a named volume
            found[target] = ROOT / source
    return found


def host_path(service: dict[str, Any], container_path: str) -> Path:
    """Where a path inside the container comes from on the host, through the bind mounts."""
    path = PurePosixPath(container_path)
    for target, source in binds(service).items():
        if path == PurePosixPath(target) or PurePosixPath(target) in path.parents:
            return source / path.relative_to(target)
    raise AssertionError(f"{container_path} is not bind-mounted from the repository")


def option(command: list[str], name: str) -> str:
    """The value of `--name VALUE` or `--name=VALUE` in a command list."""
    for index, word in enumerate(command):
        if word == name:
            return command[index + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    raise AssertionError(f"{name} missing from {command}")


def test_compose_defines_the_stack_and_every_service_has_an_image(compose: dict[str, Any]) -> None:
    assert set(services(compose)) == SERVICES
    for name, service in services(compose).items():
        assert service.get("image") or service.get("build"), f"{name}: no image or build"
    # The proxy and the simulator are this repository's image (its entrypoint is `agentproxy`).
    for name in ("agentproxy", "simulator"):
        assert services(compose)[name].get("build") == ".", name
        assert services(compose)[name]["command"][0] in {"serve", "simulate"}, name


def test_every_mounted_host_path_exists(compose: dict[str, Any]) -> None:
    for name, service in services(compose).items():
        for source in binds(service).values():
            assert source.exists(), f"{name} mounts missing {source.relative_to(ROOT)}"
            assert ROOT in source.resolve().parents, f"{name} mounts {source} outside the repo"
    named = set(compose.get("volumes") or {})
    for name, service in services(compose).items():
        for volume in service.get("volumes", []):
            volume_name = volume.split(":")[0] if isinstance(volume, str) else None
            if volume_name and not volume_name.startswith((".", "/", "~")):
                assert volume_name in named, f"{name}: volume {volume_name} is not declared"


def test_published_ports_bind_loopback_only(compose: dict[str, Any]) -> None:
    published = {}
    for name, service in services(compose).items():
        for port in service.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
                published[name] = str(port["target"])
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name}: {port} binds all addresses"
                published[name] = str(port).rsplit(":", 1)[1]
    assert published == {"agentproxy": "4000", "prometheus": "9090", "grafana": "3000"}


def test_healthy_dependencies_have_a_healthcheck(compose: dict[str, Any]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for name, service in services(compose).items():
        depends = service.get("depends_on") or {}
        for dependency, spec in depends.items() if isinstance(depends, dict) else []:
            assert dependency in SERVICES, f"{name} depends on unknown {dependency}"
            if spec.get("condition") == "service_healthy":
                other = services(compose)[dependency]
                image_has_one = other.get("build") == "." and "HEALTHCHECK" in dockerfile
                assert other.get("healthcheck") or image_has_one, f"{dependency}: no healthcheck"
    assert services(compose)["agentproxy"]["depends_on"]["redis"]["condition"] == (
        "service_healthy"
    )


def test_prometheus_loads_existing_rules_and_scrapes_the_proxy(compose: dict[str, Any]) -> None:
    prometheus = services(compose)["prometheus"]
    config_path = host_path(prometheus, option(prometheus["command"], "--config.file"))
    config = yaml.safe_load(config_path.read_text())
    rule_files = config.get("rule_files") or []
    assert rule_files, "prometheus.yml loads no rules"
    for pattern in rule_files:
        assert list(config_path.parent.glob(pattern)), f"rule file {pattern} does not exist"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    proxy = jobs["agentproxy"]
    assert proxy.get("metrics_path", "/metrics") == "/metrics"
    assert proxy["scrape_interval"] == "5s"
    targets = [t for static in proxy["static_configs"] for t in static["targets"]]
    serve = services(compose)["agentproxy"]["command"]
    assert targets == [f"agentproxy:{option(serve, '--port')}"]


def test_grafana_mounts_provisioning_and_dashboards(compose: dict[str, Any]) -> None:
    grafana = services(compose)["grafana"]
    assert host_path(grafana, "/etc/grafana/provisioning").is_dir()
    assert host_path(grafana, "/var/lib/grafana/dashboards").is_dir()
    environment = grafana.get("environment") or {}
    assert str(environment.get("GF_AUTH_ANONYMOUS_ENABLED")).lower() == "true"
    assert environment.get("GF_AUTH_ANONYMOUS_ORG_ROLE") == "Viewer"


def test_the_proxy_config_validates_and_points_at_compose_services(compose: dict[str, Any]) -> None:
    proxy = services(compose)["agentproxy"]
    config_path = host_path(proxy, option(proxy["command"], "--config"))
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "validate", str(config_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr

    config = yaml.safe_load(config_path.read_text())
    # Requests through Docker's port publishing are not loopback: without keys, a 401.
    assert config["keys"]["api_keys"], "the published port needs keys.api_keys"
    assert config["server"] == {**config["server"], "host": "0.0.0.0", "port": 4000}
    simulate = services(compose)["simulator"]["command"]
    assert option(simulate, "--host") == "0.0.0.0"
    for model in config["model_list"]:
        base = urlsplit(model["litellm_params"]["api_base"])
        assert (base.hostname, base.port) == ("simulator", int(option(simulate, "--port")))
    store = config["store"]
    assert store["backend"] == "redis"
    assert urlsplit(store["url"]).hostname == "redis"
    aliases = {model["model_name"] for model in config["model_list"]}
    for policy in config["policies"]:
        for chain in policy.get("fallbacks", []):
            assert {chain["from"], *chain["to"]} <= aliases


def test_docker_compose_accepts_the_file() -> None:
    """Compose's own validation, which needs the docker CLI and its compose plugin but no
    engine."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("the docker CLI is not installed")
    plugin = subprocess.run(
        [docker, "compose", "version"], capture_output=True, text=True, check=False, timeout=30
    )
    if plugin.returncode != 0:
        pytest.skip(f"docker has no compose plugin: {plugin.stderr.strip()}")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not re.search(r"(?i)warn", result.stderr), result.stderr
