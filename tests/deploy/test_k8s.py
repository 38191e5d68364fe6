"""deploy/k8s: what `kubectl apply -k` would create, checked offline.

The kustomization is rendered here (the subset it uses; anything else fails the test) and
every resource is validated against the Kubernetes JSON schemas (kubernetes-validate, strict:
unknown fields fail), the ServiceMonitor against the Prometheus Operator's CRD models. Then
what makes it work: probes on the proxy's real routes, a grace period that covers the drain,
the configuration mounted as a hot-reloading folder and equivalent to compose's.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from aiohttp.test_utils import TestServer

from proxy.policies.loader import load_config
from proxy.policies.spec import Config
from tests.conftest import ProxyFactory, sim_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES = "1.30.0"  # the oldest release with the preStop sleep action
# The keys of a kustomization this renderer understands; kustomize itself knows many more.
SUPPORTED = {"apiVersion", "kind", "namespace", "resources", "configMapGenerator",
             "secretGenerator", "generatorOptions", "labels"}  # fmt: skip
CLUSTER_SCOPED = {"Namespace"}
DEMO_ENV = {
    "AGENTPROXY_API_KEY": "sk-agentproxy-demo",
    "AGENTPROXY_ADMIN_KEY": "sk-agentproxy-demo-admin",
    "AGENTPROXY_REDIS_URL": "redis://redis:6379/0",
}

Resource = dict[str, Any]


def render(root: Path) -> list[Resource]:
    """`kustomize build root` for the features kustomization.yaml uses."""
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
    assert set(kustomization) <= SUPPORTED, set(kustomization) - SUPPORTED
    assert kustomization["generatorOptions"] == {"disableNameSuffixHash": True}
    out: list[Resource] = []
    for name in kustomization["resources"]:
        out += [doc for doc in yaml.safe_load_all((root / name).read_text()) if doc]
    for generator in kustomization.get("configMapGenerator", []):
        assert set(generator) == {"name", "files"}
        data = {Path(f).name: (root / f).read_text() for f in generator["files"]}
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": generator["name"]}, "data": data})  # fmt: skip
    for generator in kustomization.get("secretGenerator", []):
        assert set(generator) == {"name", "literals"}
        pairs = dict(literal.split("=", 1) for literal in generator["literals"])
        data = {k: base64.b64encode(v.encode()).decode() for k, v in pairs.items()}
        out.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": generator["name"]}, "data": data})  # fmt: skip
    for resource in out:
        metadata = resource.setdefault("metadata", {})
        if resource["kind"] not in CLUSTER_SCOPED:
            metadata["namespace"] = kustomization["namespace"]
        for label in kustomization.get("labels", []):
            assert set(label) == {"pairs"}  # metadata labels only, never selectors
            metadata.setdefault("labels", {}).update(label["pairs"])
    return out


@pytest.fixture(scope="module")
def resources() -> list[Resource]:
    return render(K8S)


def the(resources: list[Resource], kind: str, name: str) -> Resource:
    found = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)}"
    return found[0]


def container(resources: list[Resource], name: str = "agentproxy") -> dict[str, Any]:
    spec = the(resources, "Deployment", name)["spec"]["template"]["spec"]
    found: dict[str, Any] = spec["containers"][0]
    return found


@pytest.fixture
def demo_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in DEMO_ENV.items():
        monkeypatch.setenv(name, value)
    yield


def k8s_config(resources: list[Resource], tmp_path: Path) -> Config:
    """The configuration as the pods load it: the ConfigMap's files in one folder."""
    folder = tmp_path / "etc-agentproxy"
    folder.mkdir()
    for name, text in the(resources, "ConfigMap", "agentproxy-config")["data"].items():
        (folder / name).write_text(text)
    return load_config(folder)


# -- schemas ----------------------------------------------------------------------------------


def test_every_resource_is_valid_against_the_kubernetes_schemas(resources: list[Resource]) -> None:
    kinds = {r["kind"] for r in resources}
    expected = {"Deployment", "Service", "ConfigMap", "Secret", "StatefulSet",
                "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"}  # fmt: skip
    assert expected <= kinds
    for resource in resources:
        if resource["kind"] == "ServiceMonitor":
            continue  # not a Kubernetes kind: the next test
        kubernetes_validate.validate(resource, KUBERNETES, strict=True)


def test_the_validator_catches_what_it_should(resources: list[Resource]) -> None:
    """No test that cannot fail: a misspelt field and a wrong type are rejected."""
    deployment = the(resources, "Deployment", "agentproxy")
    misspelt = yaml.safe_load(yaml.safe_dump(deployment))
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelt, KUBERNETES, strict=True)
    wrong = yaml.safe_load(yaml.safe_dump(deployment))
    wrong["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, KUBERNETES, strict=True)


def strict_schema(model: Any) -> dict[str, Any]:
    """The model's JSON schema with unknown fields refused everywhere (the CRD's own rule)."""
    schema: dict[str, Any] = model.model_json_schema(by_alias=True)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


def test_the_service_monitor_is_valid_for_the_prometheus_operator(
    resources: list[Resource],
) -> None:
    import jsonschema
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

    monitor = the(resources, "ServiceMonitor", "agentproxy")
    validator = jsonschema.Draft202012Validator(strict_schema(ServiceMonitor))
    assert list(validator.iter_errors(monitor)) == []
    ServiceMonitor.model_validate(monitor)
    misspelt = yaml.safe_load(yaml.safe_dump(monitor))
    misspelt["spec"]["endpoints"][0]["intervall"] = "15s"
    assert list(validator.iter_errors(misspelt)), "an unknown field must be refused"


# -- what makes it work -----------------------------------------------------------------------


def test_the_pieces_select_each_other(resources: list[Resource]) -> None:
    deployment = the(resources, "Deployment", "agentproxy")
    pods = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pods.items()
    service = the(resources, "Service", "agentproxy")
    assert service["spec"]["selector"].items() <= pods.items()
    ports = {p["name"] for p in container(resources)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    monitor = the(resources, "ServiceMonitor", "agentproxy")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
        p["name"] for p in service["spec"]["ports"]
    }
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    hpa = the(resources, "HorizontalPodAutoscaler", "agentproxy")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "agentproxy"}  # fmt: skip
    pdb = the(resources, "PodDisruptionBudget", "agentproxy")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pods.items()
    redis = the(resources, "Service", "redis")
    assert redis["spec"]["selector"].items() <= (
        the(resources, "StatefulSet", "redis")["spec"]["template"]["metadata"]["labels"].items()
    )


async def test_the_probes_ask_the_proxys_own_routes(
    resources: list[Resource], proxy: TestServer
) -> None:
    import aiohttp

    probes = container(resources)
    paths = {
        probes[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe", "startupProbe")
    }
    assert paths == {"/readyz", "/healthz"}
    async with aiohttp.ClientSession() as http:
        for path in (*paths, "/metrics"):
            async with http.get(str(proxy.make_url(path))) as response:
                assert response.status == 200, path


def test_the_grace_period_covers_pre_stop_and_the_drain(
    resources: list[Resource], tmp_path: Path, demo_env: None
) -> None:
    config = k8s_config(resources, tmp_path)
    pod = the(resources, "Deployment", "agentproxy")["spec"]["template"]["spec"]
    pre_stop = container(resources)["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + config.server.drain_s + 5
    assert (
        the(resources, "Deployment", "agentproxy")["spec"]["strategy"]["rollingUpdate"][
            "maxUnavailable"
        ]
        == 0
    )


def test_the_config_is_a_mounted_folder_and_every_variable_it_names_is_set(
    resources: list[Resource], tmp_path: Path, demo_env: None
) -> None:
    proxy = container(resources)
    folder = proxy["args"][proxy["args"].index("--config") + 1]
    (mount,) = [m for m in proxy["volumeMounts"] if m["mountPath"] == folder]
    assert "subPath" not in mount, "a subPath mount never sees the ConfigMap change"
    volumes = the(resources, "Deployment", "agentproxy")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "agentproxy-config"

    secret = the(resources, "Secret", "agentproxy-keys")
    provided = {e["name"] for e in proxy.get("env", [])}
    for source in proxy.get("envFrom", []):
        assert source["secretRef"]["name"] == secret["metadata"]["name"]
        provided |= set(secret["data"])
    texts = the(resources, "ConfigMap", "agentproxy-config")["data"].values()
    named = {value.split("/", 1)[1] for text in texts for value in strings(yaml.safe_load(text))
             if value.startswith("os.environ/")}  # fmt: skip
    assert named and named <= provided, named - provided
    config = k8s_config(resources, tmp_path)
    assert config.store.backend == "redis", "replicas must share their state"
    assert config.store.path == the_data_mount(proxy)


def unsourced(config: Config) -> dict[str, tuple[Any, ...]]:
    """The deployments without the file each came from (the folders differ)."""
    return {
        alias: tuple(dataclasses.replace(d, source="") for d in group)
        for alias, group in config.deployments.items()
    }


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def the_data_mount(proxy: dict[str, Any]) -> str:
    (mount,) = [m["mountPath"] for m in proxy["volumeMounts"] if m["name"] == "data"]
    return str(mount)


def test_kubernetes_and_compose_run_the_same_configuration(
    resources: list[Resource], tmp_path: Path, demo_env: None
) -> None:
    k8s = k8s_config(resources, tmp_path)
    compose_config = load_config(ROOT / "deploy" / "agentproxy.yaml")
    assert k8s.server == compose_config.server
    assert k8s.store == compose_config.store
    assert k8s.keys == compose_config.keys
    assert unsourced(k8s) == unsourced(compose_config)
    assert k8s.policies == compose_config.policies

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    assert {"agentproxy", "redis", "simulator"} <= set(compose)
    grace = compose["agentproxy"]["stop_grace_period"]
    assert grace.endswith("s") and int(grace[:-1]) >= k8s.server.drain_s + 5
    redis_args = the(resources, "StatefulSet", "redis")["spec"]["template"]["spec"]["containers"][
        0
    ]["args"]
    assert compose["redis"]["command"] == redis_args


# -- the ConfigMap reloads in place -----------------------------------------------------------


def configmap_volume(root: Path, version: str, files: dict[str, str]) -> None:
    """Write `files` as the kubelet does: a new timestamped folder, then one atomic rename of
    the ..data link; the visible names are links through ..data, made once."""
    stamp = root / f"..{version}"
    stamp.mkdir()
    for name, text in files.items():
        (stamp / name).write_text(text)
    (root / "..data_tmp").symlink_to(stamp.name)
    os.replace(root / "..data_tmp", root / "..data")
    for name in files:
        if not (root / name).is_symlink():
            (root / name).symlink_to(Path("..data") / name)


async def test_an_edited_configmap_is_reloaded_without_a_restart(
    tmp_path: Path, sim_server: TestServer, start_proxy: ProxyFactory
) -> None:
    import aiohttp

    url = str(sim_server.make_url("")).rstrip("/")
    settings = f"store: {{path: {tmp_path / 'data'}}}\nserver: {{watch_interval_s: 0.05}}\n"
    base = sim_config(url, settings)
    volume = tmp_path / "etc-agentproxy"
    volume.mkdir()
    configmap_volume(volume, "2026_01_01_00_00_00.1", {"agentproxy.yaml": base})
    proxy = await start_proxy(volume)

    async def models() -> set[str]:
        async with aiohttp.ClientSession() as http:
            async with http.get(str(proxy.make_url("/v1/models"))) as response:
                return {m["id"] for m in (await response.json())["data"]}

    assert await models() == {"sim"}
    edited = sim_config(url, settings, more_models=("sim-two",))
    configmap_volume(volume, "2026_01_01_00_01_00.2", {"agentproxy.yaml": edited})
    for _ in range(100):
        if await models() == {"sim", "sim-two"}:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the swapped ConfigMap was not reloaded")
