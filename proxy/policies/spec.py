"""Frozen configuration objects: what the loader produces and the rest of the proxy reads.

A `Config` is immutable. A reload builds a new one and swaps a single reference, so a request
holds the `Config` it started with until it ends.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# litellm providers whose chat endpoint speaks OpenAI's wire format; they take the aiohttp
# fast path. Every other provider goes through litellm.
OPENAI_COMPATIBLE_PROVIDERS: Mapping[str, str | None] = {
    "openai": "https://api.openai.com/v1",
    "custom_openai": None,
    "openai_like": None,
    "hosted_vllm": None,
    "lm_studio": "http://127.0.0.1:1234/v1",
    "groq": "https://api.groq.com/openai/v1",
    "deepseek": "https://api.deepseek.com/v1",
    "xai": "https://api.x.ai/v1",
    "together_ai": "https://api.together.xyz/v1",
    "fireworks_ai": "https://api.fireworks.ai/inference/v1",
    "openrouter": "https://openrouter.ai/api/v1",
}


def key_digest(secret: str) -> bytes:
    """Keys are kept and compared as SHA-256 digests; the secret itself is never stored.
    A header's bytes that are not UTF-8 arrive as lone surrogates: `surrogatepass` digests them
    too (matching no configured key) instead of failing."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True, slots=True)
class Deployment:
    """One entry of `model_list`: an alias clients send, and where it really goes."""

    alias: str
    model: str  # litellm spelling, "provider/name"
    provider: str
    upstream_model: str  # the name sent to the provider
    api_base: str | None
    api_key: str | None = field(repr=False)
    timeout_s: float | None = None
    stream_timeout_s: float | None = None
    extra_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    # Everything from litellm_params, for the litellm upstream (may hold credentials).
    litellm_params: Mapping[str, Any] = field(default_factory=dict, repr=False)
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    input_cost_per_token: float | None = None
    output_cost_per_token: float | None = None
    cache_read_cost_per_token: float | None = None  # model_info.cache_read_input_token_cost
    cache_write_cost_per_token: float | None = None  # model_info.cache_creation_input_token_cost

    def secrets(self) -> tuple[str, ...]:
        """What this deployment sends the provider that a recording or a session name may
        never hold: its api_key and its extra_headers' values (a value's credential alone
        too: the token of `Bearer <token>`)."""
        found = [self.api_key] if self.api_key else []
        for value in self.extra_headers.values():
            found += [value, value.partition(" ")[2].strip()] if " " in value else [value]
        return tuple(s for s in found if s)

    # model_info.supports_null_content: False = the server refuses `content: null` on an
    # assistant message (llama-cpp-python), so it gets "" (proxy/pipeline/compat.py); None =
    # unknown, learnt from the first such refusal.
    supports_null_content: bool | None = None
    # model_info.supports_vision / supports_pdf_input / supports_function_calling /
    # supports_reasoning: what the model takes, over litellm's model map; None = the map's
    # word, and unknown there = assumed supported (proxy/pipeline/capabilities.py).
    supports_vision: bool | None = None
    supports_pdf_input: bool | None = None
    supports_function_calling: bool | None = None
    supports_reasoning: bool | None = None
    source: str = ""  # "file.yaml: model_list[3]", for messages

    @property
    def fast_path(self) -> bool:
        """True when the aiohttp OpenAI-compatible upstream can serve this deployment."""
        return self.provider in OPENAI_COMPATIBLE_PROVIDERS and self.base_url is not None

    @property
    def base_url(self) -> str | None:
        base = self.api_base or OPENAI_COMPATIBLE_PROVIDERS.get(self.provider)
        return base.rstrip("/") if base else None


@dataclass(frozen=True, slots=True)
class RateLimits:
    """How fast one subject (a key, a team, a session, everyone) may call: requests and tokens
    a minute, and requests at once (proxy/guards/rate_limits.py). None: that one is unlimited.
    One type for a key's own `limits` and each scope of a policy's."""

    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    # When the shared store (Redis) cannot be reached: let the request through unchecked
    # (as budgets do by default), or refuse it with 503 rate_limit_unavailable.
    on_store_error: Literal["allow", "refuse"] = "allow"


LimitScope = Literal["session", "key", "team", "global"]
LIMIT_SCOPES: tuple[LimitScope, ...] = ("session", "key", "team", "global")


@dataclass(frozen=True, slots=True)
class PolicyLimits:
    """A policy's rate limits, one block per scope: each session (scoped by its owner), each
    key, each team, or everyone the policy serves together."""

    session: RateLimits | None = None
    key: RateLimits | None = None
    team: RateLimits | None = None
    global_: RateLimits | None = None  # `global` in YAML
    # The blocks given, in scope order: what each request walks (computed once).
    scopes: tuple[tuple[LimitScope, RateLimits], ...] = field(
        init=False, repr=False, compare=False, default=()
    )

    def __post_init__(self) -> None:
        found = (self.session, self.key, self.team, self.global_)
        given = tuple((s, one) for s, one in zip(LIMIT_SCOPES, found, strict=True) if one)
        object.__setattr__(self, "scopes", given)


KeySource = Literal["yaml", "store"]


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    digest: bytes = field(repr=False)
    team: str | None = None
    models: frozenset[str] | None = None  # aliases this key may use; None = all
    limits: RateLimits | None = None  # the key's own, over every policy's
    # Where it was made: the configuration's files, or POST /admin/keys (the store's, with
    # when it was made and last rotated).
    source: KeySource = "yaml"
    created_at: float | None = None
    rotated_at: float | None = None


SessionScope = Literal["key", "team"]


@dataclass(frozen=True, slots=True)
class Keys:
    api_keys: tuple[ApiKey, ...] = ()
    admin_digest: bytes | None = field(default=None, repr=False)
    # Whose sessions a session id names: the key's own (default), or its team's.
    session_scope: SessionScope = "key"
    # The keys by digest: one lookup a request, however many keys (built once per Keys).
    by_digest: Mapping[bytes, ApiKey] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        table = {key.digest: key for key in self.api_keys if key.digest}
        object.__setattr__(self, "by_digest", table)

    def find(self, secret: str) -> ApiKey | None:
        """One dict lookup by the presented key's SHA-256. Its time tells nothing of a stored
        key: what is hashed into the table is a digest the caller cannot steer toward one."""
        return self.by_digest.get(key_digest(secret))

    def is_admin(self, secret: str) -> bool:
        if self.admin_digest is None:
            return False
        return hmac.compare_digest(key_digest(secret), self.admin_digest)

    def named(self, name: str) -> ApiKey | None:
        return next((key for key in self.api_keys if key.name == name), None)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = "127.0.0.1"
    # More names a loopback client may call the proxy by when it sends no key (lowercase, no
    # port): proxy/http/auth.py, HostNames.
    allowed_hosts: tuple[str, ...] = ()
    port: int = 4000
    max_body_bytes: int = 32 * 1024 * 1024
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0  # longest silence tolerated from an upstream
    # A whole non-streaming reply, from sending the request to its last byte. A model writes
    # the whole answer before the first byte (up to read_timeout_s of silence), then the
    # body arrives in a burst: 900 s leaves 5 minutes over that for the body, and still stops
    # an upstream that drips bytes just often enough to never be silent.
    response_timeout_s: float = 900.0
    # A whole stream, from its first event on, recall rounds included (None: no total; a
    # stream runs while it keeps talking and its client stays, read_timeout_s bounds silences).
    stream_timeout_s: float | None = None
    # A non-streaming body is held whole (it is parsed for usage and recall): 64 MiB is twice
    # the request cap and far above real answers (a 32k-token answer with top_logprobs=20 is
    # ~20 MB), while 8 concurrent hostile bodies still stay near half a GB.
    max_response_bytes: int = 64 * 1024 * 1024
    # One SSE event is one delta, a few hundred bytes; 8 MiB leaves room for providers that
    # send a whole answer, a large tool-call argument or a base64 image in one event. Only the
    # unfinished event is held, so this bounds a stream's memory.
    max_event_bytes: int = 8 * 1024 * 1024
    watch_interval_s: float = 1.0
    # A changed file is applied only once its contents stayed the same this long: a reload
    # never catches a file half-written (a slow copy, an editor that truncates then writes).
    reload_settle_s: float = 1.0
    access_log: bool = False  # successes too; failures are always logged
    log_format: Literal["text", "json"] = "text"  # json: one object per line (read at start)
    # The event loop: uvloop where installed (auto), or the one named (read at start).
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    memo_mb: int = 256  # in-process warm-turn memos, all together (read at start)
    # A session idle this long leaves the process's memory (its next turn reads what it needs
    # back from the store), so memory follows the sessions active lately, not all ever seen.
    memo_idle_s: float = 60.0
    # Summaries written ahead of the trigger (compaction.prepare_at), in flight at once in the
    # process; one per session at most (read at start).
    max_prepared_summaries: int = 4
    # A block of this many KiB or more gets a mapping of its own rather than grow the main heap
    # (None: glibc's default, which rises to 32 MiB): proxy/runtime/heap.py. Read at start.
    mmap_threshold_kb: int | None = 32
    body_timeout_s: float = 60.0  # longest silence while a request body is read (nginx's)
    # A request's whole head (request line and headers), from the connection's opening or the
    # next head's first byte: slowloris clients and silent connections are cut.
    head_timeout_s: float = 15.0
    max_in_flight: int = 1000  # requests handled at once; more get 503 with Retry-After
    # The bytes of request bodies those requests hold, all together (a body's Content-Length
    # is reserved before it is read); past it, 503 with Retry-After.
    max_body_bytes_in_flight: int = 512 * 1024 * 1024
    drain_s: float = 30.0  # on SIGTERM, how long requests in flight may still finish
    # Past this resident size a worker hands over to a fresh one (read at start; None: never).
    max_rss_mb: int | None = None


@dataclass(frozen=True, slots=True)
class StoreSettings:
    backend: Literal["local", "redis"] = "local"
    path: str = ".agentproxy"  # the local store's directory, and the event log's default home
    event_log: str | None = None  # JSONL of every rewrite; default <path>/events.jsonl
    event_log_max_mb: float = 100.0  # the event log rotates past this size...
    event_log_keep: int = 5  # ...keeping this many rotated files (events.jsonl.1 ... .5)
    url: str | None = None  # redis only
    prefix: str = "agentproxy:"  # of every Redis key; replicas sharing state share it
    timeout_s: float = 0.5  # one Redis operation; past it the request goes on without it
    # Retention: a session's data goes this long after its last request (7 days).
    session_ttl_s: float = 7 * 24 * 3600.0
    max_mb: int | None = 1024  # size cap, enforced by evicting least recently active sessions
    # Of max_mb, what one key (or team) may hold (proxy/store/shares.py); None: an equal split.
    max_owner_share: float | None = None
    live_s: float = 3600.0  # a session active this recently is never evicted for the cap
    gc_interval_s: float = 60.0

    @property
    def event_log_path(self) -> str:
        return self.event_log or f"{self.path.rstrip('/')}/events.jsonl"


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """OpenTelemetry traces over OTLP/HTTP (the `otel` extra), read at start. What is left
    unset here the standard OTEL_* variables decide (endpoint, service name, sampler)."""

    enabled: bool = False
    endpoint: str | None = None  # the collector's base URL; /v1/traces is added
    service_name: str | None = None  # else OTEL_SERVICE_NAME, else "agentproxy"
    sample_ratio: float | None = None  # share of requests traced; else OTEL_TRACES_SAMPLER


@dataclass(frozen=True, slots=True)
class PolicyMatch:
    """All given conditions must hold; within a list any entry may match. Empty = always."""

    models: frozenset[str] | None = None
    keys: frozenset[str] | None = None
    headers: tuple[tuple[str, str], ...] = ()  # (lower-case name, exact value)

    def matches(self, alias: str, key_name: str | None, headers: Mapping[str, str]) -> bool:
        if self.models is not None and alias not in self.models:
            return False
        if self.keys is not None and key_name not in self.keys:
            return False
        return all(headers.get(name) == value for name, value in self.headers)


@dataclass(frozen=True, slots=True)
class RepairSpec:
    """Patch dangling tool calls, orphan and duplicate results, misplaced results."""

    enabled: bool = True
    orphans: Literal["note", "drop"] = "note"


@dataclass(frozen=True, slots=True)
class OffloadSpec:
    """Move tool results above `min_tokens` to the store, leaving a pointer and a preview."""

    enabled: bool = True
    min_tokens: int = 20_000
    max_window_share: float = 0.25  # ...or above this share of the target model's window
    preview_lines: int = 5  # first and last lines kept in the pointer
    line_chars: int = 1_000  # each preview line cut at this length


WRITING_TOOLS = (
    "write_file", "edit_file", "str_replace", "create", "create_file", "apply_patch",
    "str_replace_editor", "str_replace_based_edit_tool", "write", "edit", "multi_edit",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class CompactionSpec:
    """Fit the history to the target model's window: truncate, summarize, cut middle-out."""

    enabled: bool = True
    trigger: float = 0.85  # fraction of the window that starts compaction
    # ...and the fraction it compacts to: well under the trigger, so that the next compaction
    # (a summarizer call) is several turns away.
    target: float = 0.5
    keep_recent: float = 0.10  # fraction of the window kept verbatim at the end
    keep_messages: int | None = None  # or keep this many recent messages instead
    truncate_tools: tuple[str, ...] = WRITING_TOOLS
    truncate_min_chars: int = 2_000  # string arguments longer than this are truncated
    truncate_head_chars: int = 200  # how much of a truncated argument stays
    summarizer_model: str | None = None  # an alias; None = the request's own model
    summarizer_timeout_s: float = 60.0
    # Past this fraction of the trigger, the summary the next compaction needs is written in
    # the background, so the turn that crosses the trigger does not wait for it (None or
    # >= 1: off).
    prepare_at: float | None = 0.75
    # The session's intent, kept verbatim beside every summary: the first user message, or
    # (when set) the lines of user messages this regular expression finds, e.g. "^GOAL:.*".
    intent: str | None = None
    reactive: bool = True  # compact and retry once when the provider says it overflowed
    reactive_target: float = 0.6  # fraction of the window to compact to after an overflow
    # A history whose client manages its context (its own context edits or compaction state):
    # "honour" leaves it to the client (the proxy compacts it only after an overflow),
    # "override" compacts it like any other.
    client_managed: str = "honour"


@dataclass(frozen=True, slots=True)
class RecallSpec:
    """Offer the model the proxy's own `agentproxy_recall` tool, answered by the proxy."""

    enabled: bool = True
    max_rounds: int = 3


@dataclass(frozen=True, slots=True)
class RecordSpec:
    """Keep each turn of a session (request received and sent, answer, events) in the store,
    content-addressed, for replay and the inspector (proxy/recording/sessions.py)."""

    enabled: bool = False
    max_mb_per_session: float = 50.0
    # Regular expressions whose matches are replaced by "[redacted]" before anything is
    # stored (keys the proxy knows are always redacted).
    redact: tuple[str, ...] = ()
    # The patterns compiled once by the loader (one alternation); None: none configured.
    redact_pattern: re.Pattern[str] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class SecretsSpec:
    """Secrets in what the client sends replaced by stable placeholders before the upstream
    sees them, and given back where the model's answer carries one (proxy/guards/secrets/)."""

    scrub: bool = False
    patterns: tuple[str, ...] = ()  # more secrets, as regular expressions (whole matches)


@dataclass(frozen=True, slots=True)
class ToolCallRule:
    """One guard rule over the model's tool calls (proxy/guards/tool_rules.py): a call whose
    tool and arguments match is denied (never reaches the client) or warned of (passes)."""

    action: Literal["deny", "warn"]
    # The tool: an exact name, or (written /…/) a regular expression matched against the
    # whole name; None: any tool.
    tool: str | None = None
    tool_pattern: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    # Searched in the arguments as the model wrote them (their JSON text), the session's
    # secret placeholders given back (what the agent would run); None: any.
    arguments: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    reason: str = ""
    label: str = "0"  # the rule's name, else its index: the metric's `rule` label

    def watches(self, tool: str) -> bool:
        """A call of `tool` could match this rule (its arguments not yet known)."""
        if self.tool_pattern is not None:
            return self.tool_pattern.fullmatch(tool) is not None
        return self.tool is None or self.tool == tool


@dataclass(frozen=True, slots=True)
class GuardSpec:
    """What may pass between the agent and the provider: secrets scrubbed on the way up and
    given back, the model's tool calls judged on the way down (proxy/guards/)."""

    # dry_run: every guard decision is computed and reported (guard.would_…), none applied.
    mode: Literal["enforce", "dry_run"] = "enforce"
    secrets: SecretsSpec = SecretsSpec()
    tool_calls: tuple[ToolCallRule, ...] = ()


ErrorClass = Literal["transient", "overflow", "logical", "fatal"]


@dataclass(frozen=True, slots=True)
class RetrySpec:
    """One retry loop, for transient errors only: exponential backoff with full jitter."""

    attempts: int = 3  # calls in all, the first included
    base_s: float = 0.5
    factor: float = 2.0
    cap_s: float = 8.0  # longest computed backoff
    retry_after_cap_s: float = 60.0  # longest Retry-After / retry-after-ms honoured
    attempt_timeout_s: float | None = None  # per call; None = the deployment's read timeout
    deadline_s: float | None = None  # for the whole request, retries and fallbacks included
    # Per-status overrides of the built-in classification, e.g. {409: transient}.
    classify: Mapping[int, ErrorClass] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FallbackSpec:
    """When `source` fails with an error of a class in `when` after its retries, try the
    aliases in `to`, in order."""

    source: str  # a model alias
    to: tuple[str, ...]
    when: tuple[ErrorClass, ...] = ("transient", "overflow")


@dataclass(frozen=True, slots=True)
class RoutingSpec:
    """Among an alias' deployments: `session` keeps a session on the one holding its prompt
    cache (proxy/control/affinity.py); `none` uses them in turn."""

    affinity: Literal["session", "none"] = "session"


@dataclass(frozen=True, slots=True)
class CircuitSpec:
    """Per deployment: open after `failures` consecutive failures, for `cooldown_s`, then
    let one probe through. Per session: refuse after `session_failures` failed calls."""

    enabled: bool = True
    failures: int = 5
    cooldown_s: float = 30.0
    session_failures: int | None = None


LoopAction = Literal["warn", "no_tools", "block"]


@dataclass(frozen=True, slots=True)
class LoopSpec:
    """An agent re-issuing an identical call: `repeats` times within the last `window`
    calls (or an A-B-A-B cycle) is stuck; each further detection climbs the ladder."""

    enabled: bool = True
    window: int = 5
    repeats: int = 3
    ladder: tuple[LoopAction, ...] = ("warn", "no_tools", "block")
    allow: tuple[str, ...] = ()  # tools meant to repeat (polling)


BudgetScope = Literal["session", "key", "team", "global"]
BudgetWindow = Literal["lifetime", "minute", "hour", "day", "month"]
BUDGET_LIMITS = ("tokens", "prompt_tokens", "completion_tokens", "cost_usd", "calls", "wall_s")


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """Spend limits for one scope and window. `limits` maps a BUDGET_LIMITS name to its value;
    past `soft` times a limit the response warns (and, with `wrap_up`, the model is asked to
    finish); at the limit the request is refused with 429 budget_exceeded, or, with
    `on_exhausted`, served by that cheaper alias for the rest of the window."""

    name: str
    scope: BudgetScope = "session"
    window: BudgetWindow = "lifetime"
    limits: Mapping[str, float] = field(default_factory=dict)
    soft: float = 0.8
    wrap_up: bool = False
    on_store_error: Literal["allow", "refuse"] = "allow"  # when spend cannot be read
    on_exhausted: str | None = None  # the alias that serves once a limit is reached


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    match: PolicyMatch = PolicyMatch()
    mode: Literal["enforce", "dry_run"] = "enforce"
    description: str = ""
    repair: RepairSpec = RepairSpec()
    offload: OffloadSpec = OffloadSpec()
    compaction: CompactionSpec = CompactionSpec()
    recall: RecallSpec = RecallSpec()
    retry: RetrySpec = RetrySpec()
    fallbacks: tuple[FallbackSpec, ...] = ()
    routing: RoutingSpec = RoutingSpec()
    circuit: CircuitSpec = CircuitSpec()
    loops: LoopSpec = LoopSpec()
    budgets: tuple[BudgetSpec, ...] = ()
    limits: PolicyLimits = PolicyLimits()
    record: RecordSpec = RecordSpec()
    guard: GuardSpec = GuardSpec()
    # When every recovery failed, answer with a normal completion that explains the outage
    # (marked x-agentproxy-degraded) so an agent loop continues instead of crashing.
    degraded: bool = False

    def fallback_for(self, alias: str, kind: ErrorClass) -> FallbackSpec | None:
        """The chain `alias` follows after a failure of class `kind` (an alias may have one
        chain per error class, e.g. LiteLLM's fallbacks and context_window_fallbacks)."""
        return next((f for f in self.fallbacks if f.source == alias and kind in f.when), None)


DEFAULT_POLICY = Policy(name="default")


@dataclass(frozen=True, slots=True)
class Config:
    version: str  # content hash of the merged configuration
    sources: tuple[str, ...]
    loaded_at: float  # unix time
    server: ServerSettings = ServerSettings()
    keys: Keys = Keys()
    store: StoreSettings = StoreSettings()
    tracing: TracingSettings = TracingSettings()
    deployments: Mapping[str, tuple[Deployment, ...]] = field(default_factory=dict)
    policies: tuple[Policy, ...] = ()
    # What no policy matches: the built-in default, with a LiteLLM config's settings if any.
    default_policy: Policy = DEFAULT_POLICY
    # The alias serving a model name no entry has (`serve --model`: one model, any name).
    catch_all: str | None = None
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what was inferred or mapped (logged at start)

    def select_policy(self, alias: str, key_name: str | None, headers: Mapping[str, str]) -> Policy:
        """First policy whose `match` holds, in file order; the default policy otherwise."""
        for policy in self.policies:
            if policy.match.matches(alias, key_name, headers):
                return policy
        return self.default_policy

    def policy_named(self, name: str, key_name: str | None = None) -> Policy | None:
        """The policy `name`, if the caller (`key_name`) may choose it by name: a header may
        choose a policy, never escape one. A policy whose `match.keys` is set is open only to
        those keys, and a key some policy is bound to may choose only among its own."""
        policy = next((p for p in self.policies if p.name == name), None)
        if policy is None or key_name is None:
            return policy
        bound_to = policy.match.keys
        if bound_to is not None:
            return policy if key_name in bound_to else None
        bound = any(p.match.keys is not None and key_name in p.match.keys for p in self.policies)
        return None if bound else policy
