"""The Grafana dashboards and provisioning files, checked offline.

Validity: each dashboard is decoded into the typed model of Grafana's Foundation SDK
(`grafana-foundation-sdk`, generated from Grafana's own dashboard schema), every decoded value
is checked against the model's type annotations (enums, literals, numbers, nested objects,
panel options and field config of the panel's type, Prometheus queries), and the model is
encoded again: a key the schema does not know is dropped on the way, so it shows up as missing.
Then the rules of this project: unique uids and panel ids, a `datasource` variable used by every
panel and target, an expr per target, `$__rate_interval` in every range, and only metric and
label names the proxy exports (read from `proxy.metrics.Metrics`, no server needed).
"""

from __future__ import annotations

import copy
import enum
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from proxy.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "grafana" / "dashboards"
PROVISIONING = ROOT / "grafana" / "provisioning"
NAMES = ("overview", "context", "resilience", "config")
DASHBOARD_MOUNT = "/var/lib/grafana/dashboards"  # where the provider reads them in Grafana
DS = {"type": "prometheus", "uid": "${datasource}"}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__range_s", "__range_ms"}
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASHBOARDS / f"{name}.json").read_text())
    return data


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p.get("type") != "row"]


# --- validation against Grafana's schema, through the Foundation SDK ------------------------


def grafana_sdk() -> Any:
    try:
        from grafana_foundation_sdk.cog import plugins
        from grafana_foundation_sdk.models import dashboard
    except ImportError:
        pytest.fail(
            "grafana-foundation-sdk is missing: pip install -e '.[dev]' "
            "(or pip install grafana-foundation-sdk)",
            pytrace=False,
        )
    plugins.register_default_plugins()
    return dashboard


def schema_problems(data: dict[str, Any]) -> list[str]:
    """What Grafana's dashboard schema (as the Foundation SDK types it) finds wrong."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    model = grafana_sdk().Dashboard.from_json(copy.deepcopy(data))
    problems: list[str] = []
    check_object(model, "dashboard", problems)
    encoded = json.loads(json.dumps(model, cls=JSONEncoder))
    problems += lost_in_round_trip(data, encoded, "dashboard")
    return problems


def lost_in_round_trip(original: Any, encoded: Any, path: str) -> list[str]:
    """Keys and values of `original` that did not survive decoding and encoding (the
    encoder may add defaults; it must not drop or change anything)."""
    if isinstance(original, dict):
        if not isinstance(encoded, dict):
            return [f"{path}: became {type(encoded).__name__}"]
        lost = []
        for key, value in original.items():
            if key not in encoded:
                lost.append(f"{path}.{key}: not in the schema (dropped)")
            else:
                lost += lost_in_round_trip(value, encoded[key], f"{path}.{key}")
        return lost
    if isinstance(original, list):
        if not isinstance(encoded, list) or len(encoded) != len(original):
            return [f"{path}: list changed"]
        lost = []
        for i, (a, b) in enumerate(zip(original, encoded, strict=True)):
            lost += lost_in_round_trip(a, b, f"{path}[{i}]")
        return lost
    return [] if original == encoded else [f"{path}: {original!r} became {encoded!r}"]


def check_object(obj: Any, path: str, problems: list[str]) -> None:
    module = vars(sys.modules[type(obj).__module__])
    hints: dict[str, Any] = {}
    for klass in reversed(type(obj).__mro__):
        hints.update(getattr(klass, "__annotations__", {}))
    for name, hint in hints.items():
        if hasattr(obj, name):
            conforms(getattr(obj, name), hint, module, f"{path}.{name}", problems)


def conforms(value: Any, hint: Any, module: dict[str, Any], path: str, problems: list[str]) -> bool:
    """Whether `value` has the annotated type; problems inside it are added to `problems`."""
    from grafana_foundation_sdk.cog import runtime, variants

    if isinstance(hint, str):
        hint = eval(hint, module)  # the SDK's forward references name its own classes
    if isinstance(hint, typing.ForwardRef):
        hint = eval(hint.__forward_arg__, module)
    if hint is typing.Any or hint is object:
        if hasattr(value, "to_json"):
            check_object(value, path, problems)
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            inner: list[str] = []
            if conforms(value, option, module, path, inner):
                problems += inner
                return True
        problems.append(f"{path}: {value!r:.80} is not {hint}")
        return False
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        if value in typing.get_args(hint):
            return True
        problems.append(f"{path}: {value!r} is not one of {typing.get_args(hint)}")
        return False
    if origin is list:
        if not isinstance(value, list):
            problems.append(f"{path}: {value!r:.80} is not a list")
            return False
        (item,) = typing.get_args(hint)
        return all(
            [conforms(v, item, module, f"{path}[{i}]", problems) for i, v in enumerate(value)]
        )
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(f"{path}: {value!r:.80} is not an object")
            return False
        _, item = typing.get_args(hint)
        return all([conforms(v, item, module, f"{path}.{k}", problems) for k, v in value.items()])
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            hint(value)
        except ValueError:
            problems.append(f"{path}: {value!r} is not one of {[m.value for m in hint]}")
            return False
        return True
    if isinstance(value, dict) and isinstance(hint, type) and hasattr(hint, "from_json"):
        # Parts the SDK keeps as plain JSON (transformations, links): decode them here.
        decoded = hint.from_json(value)
        problems += lost_in_round_trip(value, decoded.to_json(), path)
        value = decoded
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is variants.Dataquery:  # a query the SDK could not type: unknown datasource
        ok = isinstance(value, hint) and not isinstance(value, runtime.UnknownDataquery)
    elif isinstance(hint, type):
        ok = isinstance(value, hint)
    else:
        ok = True
    if not ok:
        problems.append(f"{path}: {type(value).__name__} {value!r:.80} is not {hint}")
        return False
    if hasattr(value, "to_json"):
        check_object(value, path, problems)
    return True


@pytest.mark.parametrize("name", NAMES)
def test_dashboard_is_valid_for_grafana(name: str) -> None:
    data = load(name)
    assert schema_problems(data) == []
    sdk = grafana_sdk()
    from grafana_foundation_sdk.cog import runtime

    for panel in data["panels"]:
        assert runtime.panelcfg_config(panel["type"]) is not None or panel["type"] == "row", (
            f"panel {panel['title']!r}: unknown panel type {panel['type']!r}"
        )
    assert isinstance(sdk.Dashboard.from_json(data), sdk.Dashboard)


BREAKAGES = {
    "unknown key": lambda d: d["panels"][0].update(gridpos=d["panels"][0].pop("gridPos")),
    "misspelled query field": lambda d: d["panels"][0]["targets"][0].update(legendFormt="x"),
    "wrong number type": lambda d: d["panels"][0]["gridPos"].update(h="8"),
    "unknown enum value": lambda d: d["templating"]["list"][0].update(type="datasources"),
    "bad panel option": lambda d: next(p for p in d["panels"] if p["type"] == "timeseries")[
        "options"
    ]["legend"].update(placement="middle"),
    "bad field config": lambda d: next(p for p in d["panels"] if p["type"] == "timeseries")[
        "fieldConfig"
    ]["defaults"]["custom"].update(drawStyle="curvy"),
    "unknown datasource type": lambda d: d["panels"][0]["datasource"].update(type="prometeus"),
    "not a list": lambda d: next(p for p in d["panels"] if p["type"] == "stat")["options"][
        "reduceOptions"
    ].update(calcs="lastNotNull"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_the_schema_check_catches_mistakes(breakage: str) -> None:
    data = load("overview")
    BREAKAGES[breakage](data)
    assert schema_problems(data), f"{breakage} went unnoticed"


# --- this project's rules -----------------------------------------------------------------


def test_four_dashboards_with_unique_uids_and_titles() -> None:
    assert sorted(p.stem for p in DASHBOARDS.glob("*.json")) == sorted(NAMES)
    dashboards = [load(name) for name in NAMES]
    uids = [d["uid"] for d in dashboards]
    assert len(set(uids)) == len(uids) and all(0 < len(u) <= 40 for u in uids)
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]+", u) for u in uids)
    titles = [d["title"] for d in dashboards]
    assert len(set(titles)) == len(titles)
    for d in dashboards:
        assert d["tags"] == ["agentproxy"]
        assert 36 <= d["schemaVersion"] <= 41
        assert "id" not in d or d["id"] is None  # provisioned dashboards get their own


@pytest.mark.parametrize("name", NAMES)
def test_panels_have_unique_ids_and_fit_the_grid(name: str) -> None:
    panels = load(name)["panels"]
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids), f"duplicate panel ids in {name}"
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= pos.keys() and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"{panel['title']!r} overlaps another panel"
        taken |= cells
        assert panel.get("title") and panel.get("description"), panel


@pytest.mark.parametrize("name", NAMES)
def test_every_panel_and_target_uses_the_datasource_variable(name: str) -> None:
    dashboard = load(name)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DS
    for panel in query_panels(dashboard):
        assert panel["datasource"] == DS, panel["title"]
        assert panel["targets"], f"{panel['title']!r} has no query"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", DS) == DS, panel["title"]
            assert isinstance(target.get("expr"), str) and target["expr"].strip(), panel["title"]


def every_expr() -> list[tuple[str, str, str, set[str]]]:
    """(dashboard, panel title, expr, the dashboard's variable names) for every target."""
    found = []
    for name in NAMES:
        dashboard = load(name)
        variables = {v["name"] for v in dashboard["templating"]["list"]}
        for panel in query_panels(dashboard):
            for target in panel["targets"]:
                found.append((name, panel["title"], target["expr"], variables))
    return found


def test_ranges_use_grafana_intervals_and_variables_exist() -> None:
    for name, title, expr, variables in every_expr():
        where = f"{name} / {title}: {expr}"
        code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # without string literals
        for window in re.findall(r"\[([^\]]*)\]", code):
            assert window in ("$__rate_interval", "$__range"), f"fixed range [{window}] in {where}"
        if re.search(r"\b(rate|increase)\(", expr):
            assert "[$__rate_interval]" in expr or "[$__range]" in expr, where
        for var in re.findall(r"\$\{?(\w+)", expr):
            if var.isdigit():  # a regex group in label_replace's replacement
                assert "label_replace(" in expr, where
                continue
            assert var in variables or var in GRAFANA_BUILTINS, f"unknown ${var} in {where}"
        if "histogram_quantile(" in expr:
            assert re.search(r"by \((le\b|[^)]*\ble\b)", expr), f"no `by (le)` in {where}"


def exported() -> dict[str, set[str]]:
    """Every series name the proxy can export, with its label names."""
    series: dict[str, set[str]] = {}
    for metric in vars(Metrics()).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        name, labels, kind = metric._name, set(metric._labelnames), metric._type
        if kind == "counter":
            series[f"{name}_total"] = labels
            series[f"{name}_created"] = labels
        elif kind == "histogram":
            series[f"{name}_bucket"] = labels | {"le"}
            for suffix in ("_count", "_sum", "_created"):
                series[f"{name}{suffix}"] = labels
        else:
            series[name] = labels
    return series


def test_queries_name_only_metrics_and_labels_the_proxy_exports() -> None:
    series = exported()
    problems = []
    for name, title, expr, _ in every_expr():
        where = f"{name} / {title}"
        used = set(re.findall(r"\bagentproxy_\w+", expr))
        problems += [f"{where}: no metric {m}" for m in sorted(used - series.keys())]
        known = set().union(*(series.get(m, set()) for m in used)) | TARGET_LABELS
        known |= set(re.findall(r'label_replace\([^,]+,\s*"(\w+)"', expr, flags=re.S))
        for metric, matchers in re.findall(r"\b(agentproxy_\w+)\{([^}]*)\}", expr):
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers):
                if label not in series.get(metric, set()) | TARGET_LABELS:
                    problems.append(f"{where}: {metric} has no label {label!r}")
        for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            for label in filter(None, (s.strip() for s in clause.split(","))):
                if label not in known:
                    problems.append(f"{where}: grouping by unknown label {label!r}")
    assert not problems, "\n".join(problems)


def test_the_requested_metrics_have_panels() -> None:
    everything = " ".join(expr for _, _, expr, _ in every_expr())
    for metric in (
        "agentproxy_requests_total",
        "agentproxy_request_duration_seconds_bucket",
        "agentproxy_overhead_seconds_bucket",
        "agentproxy_upstream_duration_seconds_bucket",
        "agentproxy_tokens_total",
        "agentproxy_cost_usd_total",
        "agentproxy_prompt_tokens_total",
        "agentproxy_summarizer_cost_usd_total",
        "agentproxy_time_to_first_token_seconds_bucket",
        "agentproxy_requests_in_flight",
        "agentproxy_rewrites_total",
        "agentproxy_context_tokens_total",
        "agentproxy_tokens_saved_total",
        "agentproxy_store_written_bytes_total",
        "agentproxy_summarizer_duration_seconds_bucket",
        "agentproxy_store_duration_seconds_bucket",
        "agentproxy_store_errors_total",
        "agentproxy_retries_total",
        "agentproxy_fallbacks_total",
        "agentproxy_circuit_state",
        "agentproxy_circuit_transitions_total",
        "agentproxy_upstream_errors_total",
        "agentproxy_decisions_total",
        "agentproxy_budget_used_ratio",
        "agentproxy_budget_limit",
        "agentproxy_config_reloads_total",
        "agentproxy_config_info",
        "agentproxy_config_last_reload_success",
        "agentproxy_config_loaded_timestamp_seconds",
        "agentproxy_build_info",
    ):
        assert metric in everything, f"no panel shows {metric}"


# --- provisioning ---------------------------------------------------------------------------


def read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_datasource_provisioning() -> None:
    config = read_yaml(PROVISIONING / "datasources" / "prometheus.yaml")
    assert config["apiVersion"] == 1
    (source,) = config["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy"
    assert source["isDefault"] is True and source["uid"]
    assert re.fullmatch(r"https?://[\w.-]+(:\d+)?/?", source["url"]), source["url"]
    assert re.fullmatch(r"\d+[smh]", source["jsonData"]["timeInterval"])


def test_dashboard_provider_points_at_the_dashboards_folder() -> None:
    config = read_yaml(PROVISIONING / "dashboards" / "agentproxy.yaml")
    assert config["apiVersion"] == 1
    (provider,) = config["providers"]
    assert provider["type"] == "file" and provider["name"] and provider["folder"]
    assert provider["options"]["path"] == DASHBOARD_MOUNT
    assert {p.name for p in DASHBOARDS.glob("*.json")} == {f"{n}.json" for n in NAMES}


def test_compose_mounts_match_the_provisioning() -> None:
    """The compose file (when the checkout has one) mounts what the provisioning expects,
    points the data source at its Prometheus, and scrapes as often as timeInterval says."""
    composes = [p for p in ROOT.glob("*compose*.y*ml")]
    for compose in composes:
        services = read_yaml(compose)["services"]
        grafana = next(s for s in services.values() if "grafana/grafana" in s.get("image", ""))
        mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
        assert mounts.get("./grafana/dashboards") == DASHBOARD_MOUNT
        assert mounts.get("./grafana/provisioning") == "/etc/grafana/provisioning"
        source = read_yaml(PROVISIONING / "datasources" / "prometheus.yaml")["datasources"][0]
        host = re.match(r"https?://([\w.-]+)", source["url"]).group(1)  # type: ignore[union-attr]
        assert host in services, f"data source host {host!r} is no service of {compose.name}"
    scrape_config = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    if scrape_config.exists():
        prometheus = read_yaml(scrape_config)
        job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "agentproxy")
        interval = job.get("scrape_interval", prometheus["global"]["scrape_interval"])
        source = read_yaml(PROVISIONING / "datasources" / "prometheus.yaml")["datasources"][0]
        assert source["jsonData"]["timeInterval"] == interval
