from __future__ import annotations

from proxy.control.circuit import Circuits, deployment_key
from proxy.metrics import Metrics
from proxy.policies.spec import CircuitSpec
from tests.control.fakes import Clock
from tests.pipeline.factories import deployment

SPEC = CircuitSpec(failures=3, cooldown_s=30)


def gauge(metrics: Metrics, key: str) -> float | None:
    return metrics.registry.get_sample_value("agentproxy_circuit_state", {"deployment": key})


def transitions(metrics: Metrics, key: str, state: str) -> float | None:
    labels = {"deployment": key, "state": state}
    return metrics.registry.get_sample_value("agentproxy_circuit_transitions_total", labels)


def fail(circuits: Circuits, key: str, times: int) -> None:
    for _ in range(times):
        permit = circuits.enter(key)
        assert permit is not None
        circuits.failed(permit, SPEC)


def test_opens_after_consecutive_failures_only() -> None:
    clock, metrics = Clock(), Metrics()
    circuits = Circuits(metrics, clock)
    fail(circuits, "sim#0", 2)
    permit = circuits.enter("sim#0")
    assert permit is not None
    circuits.succeeded(permit)  # breaks the streak
    fail(circuits, "sim#0", 2)
    assert circuits.usable("sim#0") and gauge(metrics, "sim#0") == 0
    fail(circuits, "sim#0", 1)
    assert not circuits.usable("sim#0") and circuits.enter("sim#0") is None
    assert gauge(metrics, "sim#0") == 2 and transitions(metrics, "sim#0", "open") == 1
    assert circuits.retry_in("sim#0") == 30
    assert circuits.describe()["sim#0"]["state"] == "open"


def test_one_probe_after_the_cooldown_and_success_closes() -> None:
    clock, metrics = Clock(), Metrics()
    circuits = Circuits(metrics, clock)
    fail(circuits, "sim#0", 3)
    clock.now += 29.9
    assert circuits.enter("sim#0") is None
    clock.now += 0.1
    assert circuits.usable("sim#0")
    probe = circuits.enter("sim#0")
    assert probe is not None and probe.probe and gauge(metrics, "sim#0") == 1
    assert circuits.enter("sim#0") is None  # the probe is out: open for everyone else
    assert not circuits.usable("sim#0")
    circuits.succeeded(probe)
    assert gauge(metrics, "sim#0") == 0 and transitions(metrics, "sim#0", "closed") == 1
    assert circuits.enter("sim#0") is not None


def test_a_failed_probe_reopens_for_a_new_cooldown() -> None:
    clock, metrics = Clock(), Metrics()
    circuits = Circuits(metrics, clock)
    fail(circuits, "sim#0", 3)
    clock.now += 30
    probe = circuits.enter("sim#0")
    assert probe is not None
    circuits.failed(probe, SPEC)
    assert gauge(metrics, "sim#0") == 2 and transitions(metrics, "sim#0", "open") == 2
    assert circuits.retry_in("sim#0") == 30


def test_a_probe_without_a_verdict_passes_to_the_next_caller() -> None:
    clock = Clock()
    circuits = Circuits(Metrics(), clock)
    fail(circuits, "sim#0", 3)
    clock.now += 30
    probe = circuits.enter("sim#0")
    assert probe is not None
    circuits.released(probe)  # its client went away
    again = circuits.enter("sim#0")
    assert again is not None and again.probe


def test_deployments_are_named_by_alias_and_place() -> None:
    a, b = deployment(alias="sim"), deployment(alias="sim", window=4096)
    assert deployment_key(a, (a, b)) == "sim#0"
    assert deployment_key(b, (a, b)) == "sim#1"


def fail_for(
    circuits: Circuits, key: str, culprit: str, times: int = 1, culprits: int | None = None
) -> None:
    for _ in range(times):
        permit = circuits.enter(key)
        assert permit is not None
        circuits.failed(permit, SPEC, culprit, culprits)


def test_failures_one_request_may_cause_count_once_per_culprit() -> None:
    circuits = Circuits(Metrics(), Clock())
    fail_for(circuits, "sim#0", "open:/s1", times=10)  # one session's bad request, retried
    assert circuits.usable("sim#0") and circuits.failures("sim#0") == 1
    fail_for(circuits, "sim#0", "open:/s2")
    assert circuits.usable("sim#0") and circuits.failures("sim#0") == 2
    fail_for(circuits, "sim#0", "open:/s3")
    assert not circuits.usable("sim#0")  # three sessions: it is the deployment


def test_one_owner_alone_never_opens_it_and_every_owner_does() -> None:
    circuits = Circuits(Metrics(), Clock())
    fail_for(circuits, "sim#0", "key:b", times=10, culprits=5)  # any number of sessions
    assert circuits.usable("sim#0") and circuits.failures("sim#0") == 1
    fail_for(circuits, "sim#0", "key:a", culprits=2)  # two tenants, both failed
    assert not circuits.usable("sim#0")


def test_a_success_forgets_which_sessions_failed() -> None:
    circuits = Circuits(Metrics(), Clock())
    fail_for(circuits, "sim#0", "key:a/s1")
    fail_for(circuits, "sim#0", "key:a/s2")
    permit = circuits.enter("sim#0")
    assert permit is not None
    circuits.succeeded(permit)
    fail_for(circuits, "sim#0", "key:a/s1")
    fail_for(circuits, "sim#0", "key:a/s2")
    assert circuits.usable("sim#0") and circuits.failures("sim#0") == 2


def test_the_deployments_own_failures_count_every_time_beside_them() -> None:
    circuits = Circuits(Metrics(), Clock())
    fail_for(circuits, "sim#0", "key:a/s1", times=3)
    fail(circuits, "sim#0", 2)  # unreachable: whoever called
    assert not circuits.usable("sim#0")
