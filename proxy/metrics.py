"""Every Prometheus object the proxy exports, in one registry per application.

Labels are bounded: route, configured model alias (or "unknown"), status code, stage, guard,
action, budget and limit names from the config, result. Never a session id, key value or message
text. Label sets a dashboard or alert asks for are created at zero up front, so a query returns
0 rather than nothing before the first event. docs/metrics.md lists every series.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.metrics import MetricWrapperBase

from proxy import __version__

# No `_created` series: they double the exposition and no dashboard or alert reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Proxy overhead lives well under a millisecond; upstream calls can take minutes.
OVERHEAD_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
)  # fmt: skip
# Store round trips: an LRU hit or a local Redis is sub-millisecond, an fsync'd write ~2 ms.
STORE_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
)  # fmt: skip


# Guards: their decisions are counted in agentproxy_decisions_total, not as rewrites.
GUARDS = frozenset({"loops", "budget", "session_circuit", "degraded", "rate_limit"})
DECISIONS = (
    ("loops", "warn"), ("loops", "no_tools"), ("loops", "block"), ("loops", "recovered"),
    ("budget", "soft_limit"), ("budget", "refused"), ("budget", "unchecked"),
    ("budget", "downgraded"),
    ("session_circuit", "refused"), ("degraded", "answered"),
    ("rate_limit", "refused"), ("rate_limit", "unchecked"),
)  # fmt: skip


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total…
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
            "Tokens reported by upstream usage (estimated for a call cut before it came), by "
            "model alias and kind (prompt, completion).",
            ["model", "kind"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "agentproxy_prompt_tokens",
            "Prompt tokens from upstream usage by how the provider's prompt cache served them "
            "(cache_read, cache_write, uncached), by model alias: the cache hit ratio.",
            ["model", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "agentproxy_cost_usd",
            "Estimated spend in US dollars from reported usage and the model's prices (cached "
            "reads and cache writes at their own rates), the proxy's own summaries included.",
            ["model"],
            registry=r,
        )
        self.summarizer_cost = Counter(
            "agentproxy_summarizer_cost_usd",
            "The part of agentproxy_cost_usd_total the proxy's own summarizer calls spent, by "
            "the model alias that wrote the summaries.",
            ["model"],
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "agentproxy_time_to_first_token_seconds",
            "Streamed requests: from the request's arrival to the first piece of the answer "
            "(text, tool arguments or reasoning) from the upstream, by model alias.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rewrites = Counter(
            "agentproxy_rewrites",
            "History rewrites applied (or computed, in dry-run), by stage and action.",
            ["stage", "action"],
            registry=r,
        )
        self.decisions = Counter(
            "agentproxy_decisions",
            "Guard decisions (loop detection, budgets, session circuits, degraded answers), "
            "by guard and action.",
            ["guard", "action"],
            registry=r,
        )
        self.guard = Counter(
            "agentproxy_guard",
            "The guard's decisions, by action and rule: scrub (a secret replaced by its "
            "placeholder before the upstream; rule: the secret's kind), deny and warn (a tool "
            "call; rule: its name, else its index in guard.tool_calls); would_… in a dry run.",
            ["action", "rule"],
            registry=r,
        )
        self.context_tokens = Counter(
            "agentproxy_context_tokens",
            "Estimated prompt tokens of chat requests as received from clients and as sent "
            "upstream after rewriting (received minus what the stages removed).",
            ["phase"],
            registry=r,
        )
        self.tokens_saved = Counter(
            "agentproxy_tokens_saved",
            "Estimated prompt tokens removed from requests by rewriting, by stage.",
            ["stage"],
            registry=r,
        )
        self.context_edits = Counter(
            "agentproxy_context_edits",
            "Context edits applied, by edit (clear_tool_uses, clear_thinking, compaction) and "
            "source: client (a client's instruction the proxy carried out), provider (a "
            "provider's applied edits passed back), proxy (the proxy's own policy compaction).",
            ["edit", "source"],
            registry=r,
        )
        self.summarizer_duration = Histogram(
            "agentproxy_summarizer_duration_seconds",
            "Time per summarizer call, by result (ok, failed).",
            ["result"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.compaction_prepared = Counter(
            "agentproxy_compaction_prepared",
            "Summaries written ahead of the compaction trigger, by result: started, used (a "
            "crossing turn took it), wasted (written but never used: the history changed, the "
            "session went idle, the process stopped), failed, skipped (the global bound or a "
            "budget), elsewhere (another replica claimed it and writes it).",
            ["result"],
            registry=r,
        )
        self.store_duration = Histogram(
            "agentproxy_store_duration_seconds",
            "Time per store operation, by backend and operation.",
            ["backend", "operation"],
            buckets=STORE_BUCKETS,
            registry=r,
        )
        self.store_errors = Counter(
            "agentproxy_store_errors",
            "Store or shared-state operations that failed (the request went on without them).",
            ["backend", "operation"],
            registry=r,
        )
        self.store_writes = Counter(
            "agentproxy_store_writes",
            "Blobs and checkpoints handed to the store, by kind (tool_result, tool_arguments, "
            "history, checkpoint).",
            ["kind"],
            registry=r,
        )
        self.store_written_bytes = Counter(
            "agentproxy_store_written_bytes",
            "Bytes handed to the store, by kind: offloaded tool payloads, archived history, "
            "checkpoints.",
            ["kind"],
            registry=r,
        )
        self.recorded_turns = Counter(
            "agentproxy_recorded_turns",
            "Turns of sessions whose policy records them (record.enabled), by outcome: "
            "recorded, stopped (the turn that would pass record.max_mb_per_session: the "
            "session's recording ends), skipped (after it ended), failed (the store refused or "
            "failed: the request went on), dropped (the writer fell behind).",
            ["outcome"],
            registry=r,
        )
        self.store_collections = Counter(
            "agentproxy_store_collections",
            "Store collections (expiry and the size cap), by result: ok, failed.",
            ["result"],
            registry=r,
        )
        self.store_sessions_removed = Counter(
            "agentproxy_store_sessions_removed",
            "Sessions whose stored data was deleted, by reason: expired (idle past "
            "store.session_ttl), evicted (the store was over store.max_mb), owner_share (a "
            "write of the same owner would have passed store.max_owner_share).",
            ["reason"],
            registry=r,
        )
        self.store_size_bytes = Gauge(
            "agentproxy_store_size_bytes",
            "Size of the store as store.max_mb counts it, after the last collection.",
            registry=r,
        )
        self.store_max_bytes = Gauge(
            "agentproxy_store_max_bytes",
            "store.max_mb in bytes; 0 when the store has no cap.",
            registry=r,
        )
        self.store_over_cap = Gauge(
            "agentproxy_store_over_cap",
            "1 when the last collection left the store over its cap because only live "
            "sessions were left to evict.",
            registry=r,
        )
        self.store_owner_full = Counter(
            "agentproxy_store_owner_full",
            "Store writes refused because their owner (key or team) held its whole share "
            "(store.max_owner_share) with live sessions only; others' writes go on.",
            registry=r,
        )
        self.store_owner_share = Gauge(
            "agentproxy_store_owner_share",
            "The share of store.max_mb one owner may hold; 1 when not limited.",
            registry=r,
        )
        self.budget_used_ratio = Gauge(
            "agentproxy_budget_used_ratio",
            "Highest fraction of a budget's limit used by any one subject (session, key, team) "
            "charged in the current window.",
            ["budget", "limit"],
            registry=r,
        )
        self.budget_limit = Gauge(
            "agentproxy_budget_limit",
            "A budget's configured limit, in the limit's own unit.",
            ["budget", "limit"],
            registry=r,
        )
        self.rate_limited = Counter(
            "agentproxy_rate_limited",
            "Requests refused by a rate limit (429, before any upstream call), by the scope "
            "whose window was full (session, key, team, global) and the limit (rpm, tpm, "
            "max_concurrent).",
            ["scope", "limit"],
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
        self.affinity_moves = Counter(
            "agentproxy_affinity_moves",
            "Sessions moved off the deployment holding their prompt cache (routing.affinity: "
            "session), by alias and why: its call failed or its circuit was open.",
            ["model", "reason"],
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
        self.admin_auth_failures = Counter(
            "agentproxy_admin_auth_failures",
            "Admin requests refused (401), by how the audit has them: recorded (an entry of "
            "their own) or coalesced (counted in a summary entry, past the audit's limits).",
            ["audit"],
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
        self.memo_bytes = Gauge(
            "agentproxy_memo_bytes",
            "Estimated bytes held by each in-process memo (warm-turn caches), by memo.",
            ["memo"],
            registry=r,
        )
        self.memo_capacity_bytes = Gauge(
            "agentproxy_memo_capacity_bytes",
            "The bound of each in-process memo: past it, the least recently used go.",
            ["memo"],
            registry=r,
        )
        self.build_info = Gauge(
            "agentproxy_build_info",
            "The running proxy's version (value is always 1).",
            ["version"],
            registry=r,
        )
        self.build_info.labels(__version__).set(1)
        self._zero_up_front()

    def _zero_up_front(self) -> None:
        for result in ("success", "failure"):
            self.config_reloads.labels(result)
        for audit in ("recorded", "coalesced"):
            self.admin_auth_failures.labels(audit)
        for stage in ("repair", "offload", "compaction", "loops", "budget"):
            for action in ("rejected_invalid", "stage_failed"):
                self.rewrites.labels(stage, action)
        for guard, action in DECISIONS:
            self.decisions.labels(guard, action)
        for phase in ("received", "sent"):
            self.context_tokens.labels(phase)
        for edit in ("clear_tool_uses", "clear_thinking", "compaction"):
            for source in ("client", "provider", "proxy"):
                self.context_edits.labels(edit, source)
        for kind in ("tool_result", "tool_arguments", "history", "checkpoint"):
            self.store_writes.labels(kind)
            self.store_written_bytes.labels(kind)
        for result in ("ok", "failed"):
            self.store_collections.labels(result)
        for reason in ("expired", "evicted", "owner_share"):
            self.store_sessions_removed.labels(reason)

    def child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached: label sets are bounded and every request pays
        for these lookups."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def watch_memos(self, memos: dict[str, Any]) -> None:
        """Report each memo's size and bound, read at scrape time."""
        for name, memo in memos.items():
            self.memo_bytes.labels(name).set_function(_size_of(memo))
            self.memo_capacity_bytes.labels(name).set(memo.maxsize)

    def set_config_version(self, version: str, loaded_at: float) -> None:
        self.config_info.clear()
        self.config_info.labels(version).set(1)
        self.config_loaded.set(loaded_at)


def _size_of(memo: Any) -> Callable[[], float]:
    return lambda: float(memo.currsize)
