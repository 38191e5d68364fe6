"""A LiteLLM proxy config.yaml, as it is: what has an AgentProxy equivalent is mapped, and every
other key is named in one warning at start, so nothing in the file is silently ignored.

    num_retries                     retry.attempts = num_retries + 1
    request_timeout, timeout        retry.attempt_timeout_s
    allowed_fails, cooldown_time    circuit.failures = allowed_fails + 1, circuit.cooldown_s
    fallbacks                       a chain on transient errors (and overflow, unless...)
    context_window_fallbacks        ...a chain of its own on overflow
    default_fallbacks               a chain for every other alias that has none
    model_group_alias               more names for an alias' deployments
    master_key                      keys.admin_key, and the API key named "master"
    environment_variables           read by "os.environ/NAME" before the real environment

The retry, circuit and fallback settings are defaults: every policy starts from them (its own
keys win), and so does the default policy that serves what no policy matches. router_settings
wins over litellm_settings where both set a key, as in LiteLLM's router.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.policies.spec import Deployment, ErrorClass, FallbackSpec

SETTINGS_SECTIONS = ("router_settings", "litellm_settings", "general_settings")  # router first
# LiteLLM's other top-level sections: accepted, named, not applied.
ONLY_LITELLM = (
    "include", "callback_settings", "credential_list", "guardrails", "mcp_servers", "mcp_tools",
    "pass_through_endpoints", "prompts", "search_tools", "vector_store_registry",
    "files_settings", "finetune_settings", "assistant_settings", "default_vertex_config",
)  # fmt: skip
MASTER_KEY_NAME = "master"

YamlPath = tuple[str | int, ...]

# What the fast path sends of litellm_params; anything else would only reach litellm.
_FAST_PATH_PARAMS = frozenset(
    {"model", "api_base", "api_key", "timeout", "stream_timeout", "extra_headers",
     "custom_llm_provider"}
)  # fmt: skip
_RETRY_PARAMS = frozenset({"num_retries", "max_retries"})
_RATE_LIMIT = (
    "per-deployment rate limits are not enforced; budgets (window: minute, limits: calls, "
    "tokens) cap a key, a team or everyone"
)
_REASONS = {
    "routing_strategy": "a session keeps to one deployment of an alias: routing.affinity",
    "redis_host": "state is shared through store: {backend: redis, url: ...}",
    "redis_port": "state is shared through store: {backend: redis, url: ...}",
    "redis_password": "state is shared through store: {backend: redis, url: ...}",
    "content_policy_fallbacks": "no error class here stands for a content-policy refusal",
    "database_url": "keys are configured in keys.api_keys",
}


class Located(Protocol):
    """A value from a file that can say where it is (the loader's entries)."""

    @property
    def value(self) -> Any: ...

    @property
    def where(self) -> str: ...

    def place(self, sub_path: YamlPath = ()) -> str:
        """ "file:line: yaml.path" of the value or of a path inside it."""


CheckAlias = Callable[[Located, YamlPath, str], bool]  # reports an unknown alias; True if known


@dataclass(frozen=True, slots=True)
class PolicyDefaults:
    """What LiteLLM's settings make of every policy's unset keys."""

    retry: Mapping[str, Any] = field(default_factory=dict)
    circuit: Mapping[str, Any] = field(default_factory=dict)
    fallbacks: tuple[FallbackSpec, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.retry or self.circuit or self.fallbacks)


@dataclass(slots=True)
class Translation:
    defaults: PolicyDefaults = PolicyDefaults()
    group_aliases: dict[str, tuple[str, Located]] = field(default_factory=dict)  # name -> alias
    not_applied: list[str] = field(default_factory=list)  # "file:line: path (why)"
    mapped: list[str] = field(default_factory=list)  # "path -> what", for the start-up notes


def translate(
    settings: Mapping[tuple[str, str], Located],
    only_litellm: Iterable[Located],
    aliases: Iterable[str],
    check_alias: CheckAlias,
) -> Translation:
    """Map the settings sections; `settings` is keyed by (section, key), merged across files."""
    out = Translation()
    known = sorted(aliases)
    taken: set[tuple[str, str]] = set()

    def pick(key: str) -> Located | None:
        """router_settings' value of `key`, else litellm_settings'; the loser is named."""
        found = [(s, settings[(s, key)]) for s in SETTINGS_SECTIONS[:2] if (s, key) in settings]
        for section, entry in found[1:]:
            out.not_applied.append(f"{entry.place()} (router_settings.{key} is used)")
            taken.add((section, key))
        if found:
            taken.add((found[0][0], key))
        return found[0][1] if found else None

    retry: dict[str, Any] = {}
    circuit: dict[str, Any] = {}
    if (entry := pick("num_retries")) is not None:
        retry["attempts"] = entry.value + 1
        out.mapped.append(f"{entry.where}: {entry.value} -> retry.attempts: {entry.value + 1}")
    timeouts = [entry for key in ("timeout", "request_timeout") if (entry := pick(key))]
    if timeouts:
        retry["attempt_timeout_s"] = float(timeouts[0].value)
        out.mapped.append(f"{timeouts[0].where} -> retry.attempt_timeout_s: {timeouts[0].value}")
        out.not_applied += [f"{e.place()} ({timeouts[0].where} is used)" for e in timeouts[1:]]
    if (entry := pick("allowed_fails")) is not None:
        circuit["failures"] = entry.value + 1
        out.mapped.append(f"{entry.where}: {entry.value} -> circuit.failures: {entry.value + 1}")
    if (entry := pick("cooldown_time")) is not None:
        circuit["cooldown_s"] = float(entry.value)
        out.mapped.append(f"{entry.where} -> circuit.cooldown_s: {entry.value}")

    overflow = _chains(pick("context_window_fallbacks"), check_alias, out)
    general = _chains(pick("fallbacks"), check_alias, out)
    fallbacks = [FallbackSpec(src, to, ("overflow",)) for src, to in overflow.items()]
    fallbacks += [
        FallbackSpec(src, to, _general_when(src, overflow)) for src, to in general.items()
    ]
    if (entry := pick("default_fallbacks")) is not None:
        to = tuple(n for i, n in enumerate(entry.value) if check_alias(entry, (i,), n))
        fallbacks += [
            FallbackSpec(alias, to, _general_when(alias, overflow))
            for alias in known
            if alias not in general and alias not in to and to
        ]
    for name, chains in (("context_window_fallbacks", overflow), ("fallbacks", general)):
        for source, to in chains.items():
            out.mapped.append(f"{name}: {source} -> {list(to)}")
    out.defaults = PolicyDefaults(retry, circuit, tuple(fallbacks))

    if (entry := pick("model_group_alias")) is not None:
        for name, target in entry.value.items():
            alias = target if isinstance(target, str) else target["model"]
            if check_alias(entry, (name,), alias):
                out.group_aliases[name] = (alias, entry)
                out.mapped.append(f"model_group_alias: {name} -> {alias}")
            if isinstance(target, dict) and target.get("hidden"):
                out.not_applied.append(f"{entry.place((name, 'hidden'))} (listed all the same)")

    master = settings.get(("general_settings", "master_key"))
    if master is not None:
        taken.add(("general_settings", "master_key"))
        out.mapped.append(f"{master.where} -> keys.admin_key and API key '{MASTER_KEY_NAME}'")

    for (section, key), entry in settings.items():
        if (section, key) not in taken:
            out.not_applied.append(_named(entry, key))
    out.not_applied += [f"{entry.place()} (a LiteLLM section)" for entry in only_litellm]
    return out


def deployment_leftovers(
    deployment: Deployment, raw: Mapping[str, Any], entry: Located
) -> list[str]:
    """What of a model_list entry this proxy does not apply: rate limits, and litellm_params
    that only litellm reads when the deployment is called directly (the fast path)."""
    found = [f"{entry.place((key,))} ({_RATE_LIMIT})" for key in raw if key in ("rpm", "tpm")]
    for key, value in raw.get("litellm_params", {}).items():
        path = ("litellm_params", key)
        if key in ("rpm", "tpm", "weight", "order"):
            why = _RATE_LIMIT if key in ("rpm", "tpm") else "the deployments of an alias take turns"
            found.append(f"{entry.place(path)} ({why})")
        elif key in _RETRY_PARAMS:
            if value:  # 0 asks for what happens anyway
                found.append(f"{entry.place(path)} (retries are the policy's: retry.attempts)")
        elif deployment.fast_path and key not in _FAST_PATH_PARAMS:
            found.append(f"{entry.place(path)} (not sent: '{deployment.alias}' is called directly)")
    return found


def _chains(
    entry: Located | None, check_alias: CheckAlias, out: Translation
) -> dict[str, tuple[str, ...]]:
    """LiteLLM's [{alias: [fallback, ...]}], its names checked. An alias' first entry is its
    chain, as LiteLLM's router takes the first; a later one is named, not applied."""
    chains: dict[str, tuple[str, ...]] = {}
    if entry is None:
        return chains
    for index, item in enumerate(entry.value):
        for source, targets in item.items():
            if source in chains:
                out.not_applied.append(f"{entry.place((index, source))} (an earlier entry is used)")
                continue
            known_source = check_alias(entry, (index, source), source)
            to = tuple(
                name for i, name in enumerate(targets)
                if check_alias(entry, (index, source, i), name) and name != source
            )  # fmt: skip
            if source in targets:
                where = entry.place((index, source, targets.index(source)))
                out.not_applied.append(f"{where} (an alias does not fall back to itself)")
            if known_source and to:
                chains[source] = to
    return chains


def _general_when(source: str, overflow: Mapping[str, tuple[str, ...]]) -> tuple[ErrorClass, ...]:
    # LiteLLM's general fallbacks also catch a context-window error that has no chain of its own.
    return ("transient",) if source in overflow else ("transient", "overflow")


def _named(entry: Located, key: str) -> str:
    reason = _REASONS.get(key)
    return f"{entry.place()} ({reason})" if reason else entry.place()
