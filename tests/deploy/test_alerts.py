"""The Prometheus alert rules and config in deploy/prometheus, checked and unit-tested with
promtool (Debian's `prometheus` package; CI installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.registry import CollectorRegistry

from proxy.metrics import Metrics
from tests.conftest import missing

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "alerts.yml"
RULE_TESTS = PROMETHEUS / "alerts.test.yml"
CONFIG = PROMETHEUS / "prometheus.yml"


def promtool(*args: str) -> str:
    binary = shutil.which("promtool")
    if binary is None:
        missing("promtool is not installed", "`apt-get install prometheus` (it brings promtool)")
    result = subprocess.run(
        [binary, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_rules_pass_promtool_check() -> None:
    promtool("check", "rules", str(RULES))


def test_rule_unit_tests_pass() -> None:
    promtool("test", "rules", str(RULE_TESTS))


def test_prometheus_config_passes_promtool_check() -> None:
    output = promtool("check", "config", str(CONFIG))
    assert "1 rule files found" in output  # and it loads alerts.yml


def test_every_alert_is_tested_firing_and_quiet() -> None:
    names = {rule["alert"] for rule in alert_rules()}
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            assert check["alertname"] in names, f"test of unknown alert {check['alertname']}"
            expected = check.get("exp_alerts") or []
            (fired if expected else quiet).add(check["alertname"])
            for alert in expected:  # labels and annotations are both pinned
                assert alert.get("exp_labels") and alert.get("exp_annotations"), check
    assert not names - fired, f"alerts never shown firing: {sorted(names - fired)}"
    assert not names - quiet, f"alerts never shown quiet: {sorted(names - quiet)}"


def test_every_alert_waits_and_explains_itself() -> None:
    rules = alert_rules()
    assert len({rule["alert"] for rule in rules}) == len(rules), "duplicate alert names"
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"AgentProxy[A-Z]\w+", name), name
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: no `for:`"
        assert rule.get("labels", {}).get("severity") in {"warning", "critical"}, name
        annotations = rule.get("annotations", {})
        assert {"summary", "description"} <= annotations.keys(), name
        text = annotations["summary"] + annotations["description"]
        assert "$labels." in text or "$value" in text, f"{name}: annotations name nothing"


def exported_series() -> set[str]:
    """Every series name the proxy can export, labelled or not, without serving anything."""
    registry = CollectorRegistry()
    Metrics(registry)
    suffixes = {
        "counter": ("_total",),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("", "_sum", "_count"),
        "info": ("_info",),
    }
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def test_alerts_and_their_tests_use_metrics_the_proxy_exports() -> None:
    """A renamed metric must not leave an alert silently watching nothing."""
    exported = exported_series()
    used = {
        (rule["alert"], name)
        for rule in alert_rules()
        for name in re.findall(r"\bagentproxy_\w+", rule["expr"])
    }
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for series in case["input_series"]:
            name = re.match(r"\w+", series["series"])
            assert name is not None
            if name[0] != "up":
                used.add(("alerts.test.yml", name[0]))
    missing = sorted(f"{where}: {name}" for where, name in used if name not in exported)
    assert not missing, f"not exported by proxy/metrics.py: {missing}"
