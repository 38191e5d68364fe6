"""Every Prometheus object the proxy exports, in one registry per application.

Labels are bounded: route, configured model alias (or "unknown"), status code, result. Never a
session id, key value or message text.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

# Proxy overhead lives well under a millisecond; upstream calls can take minutes.
OVERHEAD_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
)  # fmt: skip


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter(
            "agentproxy_requests",
            "Requests answered, by route, model alias and HTTP status.",
            ["route", "model", "status"],
            registry=r,
        )
        self.request_duration = Histogram(
            "agentproxy_request_duration_seconds",
            "Wall time from request received to response finished.",
            ["route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_duration = Histogram(
            "agentproxy_upstream_duration_seconds",
            "Time spent waiting on the upstream provider, per call.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "agentproxy_overhead_seconds",
            "The proxy's own time per request: total minus time waiting on upstream and client.",
            ["route"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "agentproxy_upstream_errors",
            "Upstream calls that failed, by model alias and reason.",
            ["model", "reason"],
            registry=r,
        )
        self.tokens = Counter(
            "agentproxy_tokens",
            "Tokens reported by upstream usage, by model alias and kind (prompt, completion).",
            ["model", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "agentproxy_cost_usd",
            "Estimated spend in US dollars from reported usage and the model's prices.",
            ["model"],
            registry=r,
        )
        self.rewrites = Counter(
            "agentproxy_rewrites",
            "History rewrites applied (or computed, in dry-run), by stage and action.",
            ["stage", "action"],
            registry=r,
        )
        self.tokens_saved = Counter(
            "agentproxy_tokens_saved",
            "Estimated prompt tokens removed from requests by rewriting, by stage.",
            ["stage"],
            registry=r,
        )
        self.summarizer_duration = Histogram(
            "agentproxy_summarizer_duration_seconds",
            "Time per summarizer call, by result (ok, failed).",
            ["result"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "agentproxy_retries",
            "Upstream calls retried, by model alias and the error class that caused the retry.",
            ["model", "error_class"],
            registry=r,
        )
        self.fallbacks = Counter(
            "agentproxy_fallbacks",
            "Requests handed to a fallback alias, by the alias that failed, the fallback and the "
            "error class that triggered it.",
            ["from_model", "to_model", "reason"],
            registry=r,
        )
        self.circuit_state = Gauge(
            "agentproxy_circuit_state",
            "Circuit breaker state per deployment (alias#index): 0 closed, 1 half-open, 2 open.",
            ["deployment"],
            registry=r,
        )
        self.circuit_transitions = Counter(
            "agentproxy_circuit_transitions",
            "Circuit breaker state changes per deployment, by the state entered.",
            ["deployment", "state"],
            registry=r,
        )
        self.in_flight = Gauge(
            "agentproxy_requests_in_flight", "Requests being handled now.", registry=r
        )
        self.config_reloads = Counter(
            "agentproxy_config_reloads",
            "Configuration reload attempts, by result (success, failure).",
            ["result"],
            registry=r,
        )
        self.config_info = Gauge(
            "agentproxy_config_info",
            "The active configuration version (value is always 1).",
            ["version"],
            registry=r,
        )
        self.config_loaded = Gauge(
            "agentproxy_config_loaded_timestamp_seconds",
            "Unix time the active configuration was loaded.",
            registry=r,
        )
        self.config_last_reload_ok = Gauge(
            "agentproxy_config_last_reload_success",
            "1 if the last reload attempt succeeded, else 0.",
            registry=r,
        )
        for result in ("success", "failure"):
            self.config_reloads.labels(result)

    def child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached: label sets are bounded and every request pays
        for these lookups."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def set_config_version(self, version: str, loaded_at: float) -> None:
        self.config_info.clear()
        self.config_info.labels(version).set(1)
        self.config_loaded.set(loaded_at)
