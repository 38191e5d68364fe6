"""Load the YAML configuration: yaml → JSON Schema → semantic checks → a frozen `Config`.

A configuration is one YAML file, or a directory whose *.yaml / *.yml files are merged in name
order. Every problem is reported at once with its file, YAML path and line, in three stages:
YAML syntax, schema, meaning. A stage runs only when the earlier ones found nothing, because
checking the meaning of a document of the wrong shape only produces noise.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import xxhash
import yaml
from jsonschema import Draft202012Validator

from proxy.policies import litellm_compat
from proxy.policies.litellm_compat import (
    MASTER_KEY_NAME,
    ONLY_LITELLM,
    SETTINGS_SECTIONS,
    PolicyDefaults,
)
from proxy.policies.providers import KEY_VARIABLES, provider_key, split_model
from proxy.policies.spec import (
    DEFAULT_POLICY,
    LIMIT_SCOPES,
    OPENAI_COMPATIBLE_PROVIDERS,
    ApiKey,
    BudgetSpec,
    CircuitSpec,
    CompactionSpec,
    Config,
    Deployment,
    FallbackSpec,
    GuardSpec,
    Keys,
    LoopSpec,
    OffloadSpec,
    Policy,
    PolicyLimits,
    PolicyMatch,
    RateLimits,
    RecallSpec,
    RecordSpec,
    RepairSpec,
    RetrySpec,
    RoutingSpec,
    SecretsSpec,
    ServerSettings,
    SessionScope,
    StoreSettings,
    ToolCallRule,
    TracingSettings,
    key_digest,
)
from proxy.redaction import redact_url

SCHEMA_PATH = Path(__file__).with_name("config.schema.json")
ENV_PREFIX = "os.environ/"
CONFIG_SUFFIXES = (".yaml", ".yml")

YamlPath = tuple[str | int, ...]

_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_SECRET_KEYS = frozenset({"admin_key", "key", "api_key"})
_URL_KEYS = frozenset({"api_base", "url"})  # shown with their credentials redacted
SectionT = TypeVar("SectionT")
_FLOAT_SERVER_FIELDS = frozenset(
    {
        "connect_timeout_s",
        "read_timeout_s",
        "response_timeout_s",
        "stream_timeout_s",
        "watch_interval_s",
        "reload_settle_s",
        "body_timeout_s",
        "head_timeout_s",
        "drain_s",
        "memo_idle_s",
    }
)


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    file: str
    path: str  # "model_list[2].litellm_params.api_base"; "" for the file as a whole
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ConfigError(Exception):
    """The configuration cannot be used; `issues` says every reason found."""

    def __init__(self, issues: Sequence[ConfigIssue], warnings: Sequence[ConfigIssue] = ()) -> None:
        self.issues = list(issues)
        self.warnings = list(warnings)
        super().__init__("\n".join(str(issue) for issue in self.issues))


# --- public entry points ---------------------------------------------------------------------


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read, validate and merge the configuration at PATH; raise ConfigError on any error."""
    files = config_sources(path)
    if not files:
        raise ConfigError([_file_issue(path, "directory has no *.yaml or *.yml files")])
    sources, issues = _read_all(files)
    if issues:
        raise ConfigError(issues)
    return _config_of(sources)


def load_document(name: str, data: dict[str, Any]) -> Config:
    """A configuration given as data rather than a file (the CLI's `--model`), checked the same
    way; `name` stands for the file in messages."""
    source = _Source(name, data, {})
    issues = [
        issue for error in _validator().iter_errors(data) for issue in _schema_issues(source, error)
    ]
    if issues:
        raise ConfigError(issues)
    return _config_of([source])


# A key made at run time is never given its secret: the schema's `key` is filled with this
# stand-in while the body is checked, then replaced by the digest of the one minted.
_MINTED = "minted-at-run-time"


def read_api_key(
    data: Any, aliases: Iterable[str], where: str = "body"
) -> tuple[ApiKey | None, list[ConfigIssue]]:
    """A key made at run time (POST /admin/keys), checked as a YAML key is: the schema's
    `$defs/apiKey` and the same semantic checks (its models are aliases, its limits have one
    limit at least). Its digest is left empty: the caller mints the secret. Errors name the
    field; the key itself may not be given."""
    if not isinstance(data, dict):
        return None, [ConfigIssue(where, "", f"expected an object, not {type(data).__name__}")]
    source = _Source(where, data, {})
    if "key" in data:
        message = "is minted by the proxy and returned once; it cannot be chosen"
        return None, [source.issue(("key",), message)]
    checked = {**data, "key": _MINTED}
    issues = [
        issue
        for error in _key_validator().iter_errors(checked)
        for issue in _schema_issues(source, error)
    ]
    if issues:
        return None, issues
    report = _Report()
    key = _api_key(_Entry(source, (), checked), set(aliases), report)
    if report.errors:
        return None, report.errors
    return dataclasses.replace(key, digest=b"", source="store"), []


@cache
def _key_validator() -> Any:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return Draft202012Validator({"$ref": "#/$defs/apiKey", "$defs": schema["$defs"]})


def _config_of(sources: list[_Source]) -> Config:
    merged = _merge(sources)
    report = _Report()
    config = _build(merged, [s.name for s in sources], report)
    if report.errors:
        raise ConfigError(report.errors, report.warnings)
    return config


def config_sources(path: str | os.PathLike[str]) -> list[Path]:
    """The files `load_config(path)` reads, in merge order."""
    root = Path(path)
    if root.is_dir():
        return sorted((p for p in root.iterdir() if _is_config_file(p)), key=lambda p: p.name)
    if root.exists():
        return [root]
    raise ConfigError([_file_issue(path, "no such file or directory")])


def sources_fingerprint(path: str | os.PathLike[str]) -> tuple[object, ...]:
    """A value that changes when a config file is edited, added or removed; reads no contents.

    The inode is included because editors and Kubernetes ConfigMaps replace files by rename,
    which can keep both size and (coarse) mtime.
    """
    try:
        files = config_sources(path)
    except ConfigError:
        return ()
    return tuple(_stat_key(file) for file in files)


def validate_paths(
    paths: Sequence[str],
    also_warn: Callable[[Config], Iterable[str]] | None = None,
    also_refuse: Callable[[Config], Iterable[str]] | None = None,
) -> tuple[list[str], list[str]]:
    """(error lines, warning lines) for `agentproxy validate PATH...`; each PATH is one config.
    `also_warn` adds warnings about a valid config (what `serve` would warn about too), and
    `also_refuse` errors (what `serve` would refuse to start with: a missing extra)."""
    errors: list[str] = []
    warnings: list[str] = []
    for path in paths:
        try:
            config = load_config(path)
        except ConfigError as exc:
            errors += [str(issue) for issue in exc.issues]
            warnings += [str(issue) for issue in exc.warnings]
        else:
            warnings += [*(also_warn(config) if also_warn else ()), *config.warnings]
            errors += [f"{path}: {why}" for why in (also_refuse(config) if also_refuse else ())]
    return errors, warnings


# --- reading one file ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Source:
    """One parsed file, with the line of every YAML path in it."""

    name: str
    data: dict[str, Any]
    lines: dict[YamlPath, int]

    def issue(self, path: YamlPath, message: str) -> ConfigIssue:
        return ConfigIssue(self.name, _format_path(path), message, self.line_of(path))

    def line_of(self, path: YamlPath) -> int | None:
        # A path that is not in the file (a missing key) gets its nearest ancestor's line.
        for end in range(len(path), -1, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return None


def _is_config_file(path: Path) -> bool:
    # Hidden files are skipped: editors leave ".#main.yaml" lock files and swap files around.
    return path.suffix in CONFIG_SUFFIXES and not path.name.startswith(".") and path.is_file()


def _stat_key(file: Path) -> tuple[object, ...]:
    try:
        stat = file.stat()
    except OSError:
        return (file.name, None)
    return (file.name, stat.st_mtime_ns, stat.st_size, stat.st_ino)


def _file_issue(path: str | os.PathLike[str], message: str, line: int | None = None) -> ConfigIssue:
    return ConfigIssue(os.fspath(path), "", message, line)


def _read_all(files: Iterable[Path]) -> tuple[list[_Source], list[ConfigIssue]]:
    sources: list[_Source] = []
    issues: list[ConfigIssue] = []
    for file in files:
        source, file_issues = _read(file)
        issues += file_issues
        if source is not None:
            sources.append(source)
    return sources, issues


def _read(file: Path) -> tuple[_Source | None, list[ConfigIssue]]:
    name = str(file)
    try:
        data, lines, issues = _parse_yaml(name, file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return None, [_file_issue(name, f"cannot read: {exc}")]
    except yaml.YAMLError as exc:
        return None, [_yaml_issue(name, exc)]
    if data is None:
        return None, [_file_issue(name, "file is empty")]
    if not isinstance(data, dict):
        message = f"top level must be a mapping of sections, not a {type(data).__name__}"
        return None, [_file_issue(name, message, 1)]
    source = _Source(name, data, lines)
    for error in _validator().iter_errors(data):
        issues += _schema_issues(source, error)
    return source, sorted(issues, key=lambda issue: issue.line or 0)


class _Loader(yaml.SafeLoader):
    """YAML 1.2's floats too: PyYAML (YAML 1.1) reads `3e-6` — how prices are written — as a
    string, wanting a dot (`3.0e-6`)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _parse_yaml(name: str, text: str) -> tuple[Any, dict[YamlPath, int], list[ConfigIssue]]:
    """Data, the line of each path, and key problems (duplicates, non-string keys), one parse."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}, []
        lines: dict[YamlPath, int] = {}
        issues = list(_index_nodes(name, node, (), lines, set()))
        # Constructed only now: construction flattens "<<" merge keys in the node tree.
        return loader.construct_document(node), lines, issues
    finally:
        loader.dispose()


def _index_nodes(
    name: str, node: yaml.Node, path: YamlPath, lines: dict[YamlPath, int], seen: set[int]
) -> Iterator[ConfigIssue]:
    # `seen` walks an aliased node once: "*anchor" can repeat (or nest) a subtree many times.
    if id(node) in seen:
        return
    seen.add(id(node))
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _index_nodes(name, item, (*path, index), lines, seen)
    elif isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key, value in node.value:
            line = key.start_mark.line + 1
            if key.tag == _MERGE_TAG:
                continue
            if not (isinstance(key, yaml.ScalarNode) and key.tag == _STR_TAG):
                message = f"key {key.value!r} is not a string; quote it"
                yield ConfigIssue(name, _format_path(path), message, line)
                continue
            child = (*path, key.value)
            if key.value in first_line:
                message = f"duplicate key (first at line {first_line[key.value]})"
                yield ConfigIssue(name, _format_path(child), message, line)
                continue
            first_line[key.value] = line
            lines[child] = line
            yield from _index_nodes(name, value, child, lines, seen)


def _yaml_issue(name: str, exc: yaml.YAMLError) -> ConfigIssue:
    if not isinstance(exc, yaml.MarkedYAMLError):
        return _file_issue(name, f"invalid YAML: {exc}")
    message = f"invalid YAML: {exc.problem or exc.context}"
    if exc.problem and exc.context:
        context_line = f" at line {exc.context_mark.line + 1}" if exc.context_mark else ""
        message += f" ({exc.context}{context_line})"
    mark = exc.problem_mark or exc.context_mark
    return _file_issue(name, message, mark.line + 1 if mark else None)


@cache
def _validator() -> Any:
    return Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))


def _schema_issues(source: _Source, error: Any) -> Iterator[ConfigIssue]:
    path: YamlPath = tuple(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        for key in sorted(set(error.instance) - set(allowed), key=str):
            yield source.issue((*path, key), f"unknown key {key!r}{_suggest(str(key), allowed)}")
        return
    message: str = error.message
    if error.validator == "type" and error.instance is None:
        message = f"is empty; expected {error.validator_value}"
    elif path and path[-1] in _SECRET_KEYS:
        message = message.replace(repr(error.instance), "<hidden value>")
    elif path and path[-1] in _URL_KEYS and isinstance(error.instance, str):
        message = message.replace(repr(error.instance), repr(redact_url(error.instance)))
    yield source.issue(path, message)


def _format_path(path: YamlPath) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def _suggest(name: str, known: Iterable[str]) -> str:
    choices = sorted(known)
    close = difflib.get_close_matches(name, choices, n=1)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; expected one of: {', '.join(choices)}" if choices else ""


# --- merging ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Entry:
    """A value from one file, remembering where it came from for messages."""

    source: _Source
    path: YamlPath
    value: Any

    def issue(self, sub_path: YamlPath, message: str) -> ConfigIssue:
        return self.source.issue((*self.path, *sub_path), message)

    @property
    def where(self) -> str:
        return f"{self.source.name}: {_format_path(self.path)}"

    def place(self, sub_path: YamlPath = ()) -> str:
        """ "file:line: yaml.path", for a list of places in one message."""
        path = (*self.path, *sub_path)
        line = self.source.line_of(path)
        return f"{self.source.name}{'' if line is None else f':{line}'}: {_format_path(path)}"


@dataclass(slots=True)
class _Merged:
    server: dict[str, Any] = field(default_factory=dict)
    store: dict[str, Any] = field(default_factory=dict)
    tracing: dict[str, Any] = field(default_factory=dict)
    store_url: _Entry | None = None  # may be a secret (a password in it): resolved like keys
    store_entries: dict[str, _Entry] = field(default_factory=dict)  # where each key was set
    admin_key: _Entry | None = None
    session_scope: str = "key"
    api_keys: list[_Entry] = field(default_factory=list)
    model_list: list[_Entry] = field(default_factory=list)
    policies: list[_Entry] = field(default_factory=list)
    # A LiteLLM config's sections: settings by (section, key), its environment, the rest.
    litellm: dict[tuple[str, str], _Entry] = field(default_factory=dict)
    environment: dict[str, _Entry] = field(default_factory=dict)
    only_litellm: list[_Entry] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        """The merged configuration as plain data, as it was written (env refs unresolved)."""
        keys: dict[str, Any] = {"api_keys": [e.value for e in self.api_keys]}
        if self.admin_key is not None:
            keys["admin_key"] = self.admin_key.value
        if self.session_scope != "key":
            keys["session_scope"] = self.session_scope
        return {
            "server": self.server,
            "store": self.store,
            "tracing": self.tracing,
            "keys": keys,
            "model_list": [e.value for e in self.model_list],
            "policies": [e.value for e in self.policies],
            "litellm": {f"{s}.{k}": e.value for (s, k), e in self.litellm.items()},
            "environment_variables": {k: e.value for k, e in self.environment.items()},
        }


def _merge(sources: Iterable[_Source]) -> _Merged:
    """Mapping sections: later files win key by key. List sections: concatenated."""
    merged = _Merged()
    for source in sources:
        data = source.data
        merged.server.update(data.get("server", {}))
        merged.store.update(data.get("store", {}))
        merged.tracing.update(data.get("tracing", {}))
        for key, value in data.get("store", {}).items():
            merged.store_entries[key] = _Entry(source, ("store", key), value)
        if "url" in data.get("store", {}):
            merged.store_url = _Entry(source, ("store", "url"), data["store"]["url"])
        keys = data.get("keys", {})
        if "admin_key" in keys:
            merged.admin_key = _Entry(source, ("keys", "admin_key"), keys["admin_key"])
        merged.session_scope = keys.get("session_scope", merged.session_scope)
        merged.api_keys += _entries(source, ("keys", "api_keys"), keys.get("api_keys", []))
        merged.model_list += _entries(source, ("model_list",), data.get("model_list", []))
        merged.policies += _entries(source, ("policies",), data.get("policies", []))
        for section in (s for s in data if s in SETTINGS_SECTIONS):  # in file order
            for key, value in (data[section] or {}).items():
                merged.litellm[(section, key)] = _Entry(source, (section, key), value)
        for name, value in (data.get("environment_variables") or {}).items():
            merged.environment[name] = _Entry(source, ("environment_variables", name), value)
        merged.only_litellm += [_Entry(source, (s,), data[s]) for s in ONLY_LITELLM if s in data]
    return merged


def _entries(source: _Source, path: YamlPath, items: list[Any]) -> list[_Entry]:
    return [_Entry(source, (*path, index), item) for index, item in enumerate(items)]


# --- meaning and building --------------------------------------------------------------------


@dataclass(slots=True)
class _Report:
    """What one load found, and the environment its "os.environ/NAME" references read."""

    errors: list[ConfigIssue] = field(default_factory=list)
    warnings: list[ConfigIssue] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)  # LiteLLM's, in one warning
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)


def _build(merged: _Merged, sources: Sequence[str], report: _Report) -> Config:
    report.environ = _environment(merged.environment)
    deployments = _deployments(merged.model_list, report)
    litellm = _litellm(merged, set(deployments), report)
    deployments = _with_group_aliases(deployments, litellm.group_aliases, report)
    master_key = merged.litellm.get(("general_settings", "master_key"))
    keys = _keys(merged, set(deployments), report, master_key)
    key_names = {key.name for key in keys.api_keys}
    policies = _policies(merged.policies, set(deployments), key_names, report, litellm.defaults)
    _check_downgrades(merged.policies, policies, set(deployments), keys.api_keys, report)
    if report.not_applied:  # one warning, whatever the number of keys it names
        first_file = report.not_applied[0].partition(":")[0]
        message = "LiteLLM settings with no equivalent here, not applied:\n  " + "\n  ".join(
            report.not_applied
        )
        report.warnings.append(_file_issue(first_file, message))
    return Config(
        version=_version(merged.document()),
        sources=tuple(sources),
        loaded_at=time.time(),
        server=_server(merged.server),
        keys=keys,
        store=_store(merged, report),
        tracing=_tracing(merged.tracing),
        deployments=deployments,
        policies=policies,
        default_policy=_default_policy(litellm.defaults),
        warnings=tuple(str(warning) for warning in report.warnings),
        notes=tuple(report.notes),
    )


def _environment(variables: Mapping[str, _Entry]) -> Mapping[str, str]:
    """The process environment under a LiteLLM config's environment_variables (they win, as
    LiteLLM sets them); the process environment itself is left alone."""
    if not variables:
        return os.environ
    own = {name: str(e.value) for name, e in variables.items() if e.value is not None}
    return collections.ChainMap(own, os.environ)


def _litellm(merged: _Merged, aliases: set[str], report: _Report) -> litellm_compat.Translation:
    def check_alias(entry: Any, path: YamlPath, name: str) -> bool:
        before = len(report.errors)
        _check_names(entry, path, [name], aliases, "model alias", report, indexed=False)
        return len(report.errors) == before

    translation = litellm_compat.translate(
        merged.litellm, merged.only_litellm, aliases, check_alias
    )
    report.not_applied += translation.not_applied
    report.notes += [f"LiteLLM {line}" for line in translation.mapped]
    return translation


def _with_group_aliases(
    deployments: dict[str, tuple[Deployment, ...]],
    names: Mapping[str, tuple[str, Any]],
    report: _Report,
) -> dict[str, tuple[Deployment, ...]]:
    """LiteLLM's model_group_alias: `name` serves the deployments of `alias` as its own group."""
    grown = dict(deployments)
    for name, (alias, entry) in names.items():
        if name in deployments:
            message = f"{name!r} is already a model_name; pick another name"
            report.errors.append(entry.issue((name,), message))
            continue
        grown[name] = tuple(dataclasses.replace(d, alias=name) for d in deployments[alias])
    return grown


def _default_policy(defaults: PolicyDefaults) -> Policy:
    if not defaults:
        return DEFAULT_POLICY
    return Policy(
        name=DEFAULT_POLICY.name,
        retry=_retry(dict(defaults.retry)),
        circuit=_section(CircuitSpec, dict(defaults.circuit)),
        fallbacks=defaults.fallbacks,
    )


_FLOAT_STORE_FIELDS = frozenset(
    {"timeout_s", "live_s", "gc_interval_s", "event_log_max_mb", "max_owner_share"}
)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _store(merged: _Merged, report: _Report) -> StoreSettings:
    raw = dict(merged.store)
    typed: dict[str, Any] = {
        key: float(value) if key in _FLOAT_STORE_FIELDS and value is not None else value
        for key, value in raw.items()
        if key not in ("ttl_s", "session_ttl")
    }
    if "session_ttl" in raw:
        typed["session_ttl_s"] = duration_s(raw["session_ttl"])
    elif raw.get("ttl_s") is not None:  # the old name, in seconds
        typed["session_ttl_s"] = float(raw["ttl_s"])
    if "ttl_s" in raw:
        message = "ttl_s is now session_ttl (e.g. 7d); the old name still works"
        report.warnings.append(merged.store_entries["ttl_s"].issue((), message))
    if merged.store_url is not None:  # "os.environ/NAME" resolved now; unset is an error
        typed["url"] = _secret(merged.store_url, report)
    settings = StoreSettings(**typed)
    if settings.session_ttl_s < settings.live_s:
        where = merged.store_entries.get("session_ttl") or merged.store_entries.get("live_s")
        message = (
            f"session_ttl ({settings.session_ttl_s:g}s) is shorter than live_s "
            f"({settings.live_s:g}s): a session still live would expire"
        )
        report.errors.append(where.issue((), message) if where else _file_issue("store", message))
    return settings


def _tracing(values: dict[str, Any]) -> TracingSettings:
    ratio = values.get("sample_ratio")  # YAML reads "1" as an int
    return TracingSettings(**{**values, "sample_ratio": None if ratio is None else float(ratio)})


def duration_s(value: float | str) -> float:
    """Seconds from a number (seconds) or a schema-checked string such as "90s" or "7d"."""
    if isinstance(value, str):
        return float(value[:-1]) * _DURATION_UNITS[value[-1]]
    return float(value)


def _server(values: dict[str, Any]) -> ServerSettings:
    # YAML reads "timeout: 10" as an int; the settings promise floats.
    typed: dict[str, Any] = {
        key: float(value) if key in _FLOAT_SERVER_FIELDS and value is not None else value
        for key, value in values.items()
    }
    if "allowed_hosts" in typed:  # names compare in one form: lowercase, no brackets, no dot
        typed["allowed_hosts"] = tuple(
            name.strip("[]").rstrip(".").lower() for name in typed["allowed_hosts"]
        )
    return ServerSettings(**typed)


def _version(document: dict[str, Any]) -> str:
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return xxhash.xxh64(canonical.encode()).hexdigest()[:12]


def _deployments(entries: Iterable[_Entry], report: _Report) -> dict[str, tuple[Deployment, ...]]:
    groups: dict[str, list[Deployment]] = {}
    for entry in entries:
        deployment = _deployment(entry, report)
        groups.setdefault(deployment.alias, []).append(deployment)
    return {alias: tuple(group) for alias, group in groups.items()}


def _deployment(entry: _Entry, report: _Report) -> Deployment:
    raw_params = entry.value["litellm_params"]
    params: dict[str, Any] = _resolve_params(entry, ("litellm_params",), raw_params, report)
    model: str = raw_params["model"]
    provider, upstream_model, inferred = split_model(model, params.get("custom_llm_provider"))
    api_base: str | None = params.get("api_base")
    _check_endpoint(entry, model, provider, api_base, report)
    if inferred is not None:
        _note_inferred(entry, model, provider, inferred, report)
    api_key = params.get("api_key") if "api_key" in raw_params else _key_from(
        entry, provider, api_base, report
    )  # fmt: skip
    info: dict[str, Any] = entry.value.get("model_info", {})
    deployment = Deployment(
        alias=entry.value["model_name"],
        model=f"{provider}/{upstream_model}",
        provider=provider,
        upstream_model=upstream_model,
        api_base=api_base,
        api_key=api_key,
        timeout_s=_float_or_none(params.get("timeout")),
        stream_timeout_s=_float_or_none(params.get("stream_timeout")),
        extra_headers=_headers(params.get("extra_headers")),
        litellm_params=params,
        max_input_tokens=info.get("max_input_tokens"),
        max_output_tokens=info.get("max_output_tokens"),
        input_cost_per_token=_float_or_none(info.get("input_cost_per_token")),
        output_cost_per_token=_float_or_none(info.get("output_cost_per_token")),
        cache_read_cost_per_token=_float_or_none(info.get("cache_read_input_token_cost")),
        cache_write_cost_per_token=_float_or_none(info.get("cache_creation_input_token_cost")),
        supports_null_content=info.get("supports_null_content"),
        supports_vision=info.get("supports_vision"),
        supports_pdf_input=info.get("supports_pdf_input"),
        supports_function_calling=info.get("supports_function_calling"),
        supports_reasoning=info.get("supports_reasoning"),
        source=entry.where,
    )
    report.not_applied += litellm_compat.deployment_leftovers(deployment, entry.value, entry)
    return deployment


def _note_inferred(entry: _Entry, model: str, provider: str, how: str, report: _Report) -> None:
    """A bare model name got its provider as LiteLLM gives it one; a guess is a warning."""
    if how == "guessed":
        message = (
            f"{model!r} has no provider prefix and litellm's model map does not know it: "
            f"served as '{provider}/{model}' (an OpenAI-compatible API); write "
            "'provider/name' to pick another provider"
        )
        report.warnings.append(entry.issue(("litellm_params", "model"), message))
    else:
        report.notes.append(f"{entry.where}: {model!r} is '{provider}/{model}' ({how})")


def _key_from(entry: _Entry, provider: str, api_base: str | None, report: _Report) -> str | None:
    """No api_key written: the provider's usual variable, as litellm reads it."""
    found = provider_key(provider, report.environ)
    if found is not None:
        report.notes.append(f"{entry.where}: provider key from {found[0]}")
        return found[1]
    variables = KEY_VARIABLES.get(provider, ())
    if variables and api_base is None:  # the provider's own endpoint will refuse the call
        unset = " or ".join(variables)
        message = f"no api_key, and {unset} is not set; the provider will refuse calls"
        report.warnings.append(entry.issue(("litellm_params",), message))
    return None


def _check_endpoint(
    entry: _Entry, model: str, provider: str, api_base: str | None, report: _Report
) -> None:
    if not provider:
        message = f"{model!r} names no model; write it as 'provider/name', e.g. 'openai/gpt-4o'"
        report.errors.append(entry.issue(("litellm_params", "model"), message))
    elif model == "*" or model.endswith("/*"):  # LiteLLM's wildcard: "*" would go upstream
        message = f"{model!r}: wildcard routing is not supported; list each model by name"
        report.errors.append(entry.issue(("litellm_params", "model"), message))
    if api_base is not None and not _is_http_url(api_base):
        message = f"{redact_url(api_base)!r} is not an http(s) URL"
        report.errors.append(entry.issue(("litellm_params", "api_base"), message))
    has_no_default = OPENAI_COMPATIBLE_PROVIDERS.get(provider, "") is None
    if has_no_default and api_base is None:
        message = f"provider {provider!r} has no default endpoint; set api_base"
        report.errors.append(entry.issue(("litellm_params",), message))


def _resolve_params(entry: _Entry, path: YamlPath, value: Any, report: _Report) -> Any:
    """Replace "os.environ/NAME" strings anywhere in litellm_params with the variable's value."""
    if isinstance(value, dict):
        return {k: _resolve_params(entry, (*path, k), v, report) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_params(entry, (*path, i), v, report) for i, v in enumerate(value)]
    name = _env_name(value)
    if name is None:
        return value
    resolved = report.environ.get(name)
    if resolved is None and path[-1] == "api_base":
        # Not a warning: the provider's default endpoint would get traffic meant for another.
        report.errors.append(entry.issue(path, f"environment variable {name!r} is not set"))
    elif resolved is None:
        message = f"environment variable {name!r} is not set; requests to this deployment will fail"
        report.warnings.append(entry.issue(path, message))
    return resolved


def _keys(
    merged: _Merged, aliases: set[str], report: _Report, master: _Entry | None = None
) -> Keys:
    admin_digest = None
    if merged.admin_key is not None:
        admin_secret = _secret(merged.admin_key, report)
        admin_digest = key_digest(admin_secret) if admin_secret else None
    api_keys = tuple(_api_key(entry, aliases, report) for entry in merged.api_keys)
    _check_unique_keys(merged.api_keys, api_keys, admin_digest, report)
    if master is not None:
        admin_digest, api_keys = _with_master_key(master, admin_digest, api_keys, merged, report)
    scope: SessionScope = "team" if merged.session_scope == "team" else "key"
    return Keys(api_keys=api_keys, admin_digest=admin_digest, session_scope=scope)


def _with_master_key(
    master: _Entry,
    admin_digest: bytes | None,
    api_keys: tuple[ApiKey, ...],
    merged: _Merged,
    report: _Report,
) -> tuple[bytes | None, tuple[ApiKey, ...]]:
    """LiteLLM's master_key opens the admin routes and, as an API key, every model."""
    if merged.admin_key is not None:
        message = f"keys.admin_key is set too ({merged.admin_key.where}); keep one of them"
        report.errors.append(master.issue((), message))
        return admin_digest, api_keys
    secret = _secret(master, report)
    if not secret:
        return admin_digest, api_keys
    digest = key_digest(secret)
    for entry, key in zip(merged.api_keys, api_keys, strict=True):
        if key.name == MASTER_KEY_NAME:
            message = f"API key name {MASTER_KEY_NAME!r} is general_settings.master_key's"
            report.errors.append(entry.issue(("name",), message))
        elif key.digest == digest:
            report.errors.append(entry.issue(("key",), "same key as general_settings.master_key"))
    return digest, (*api_keys, ApiKey(MASTER_KEY_NAME, digest))


def _api_key(entry: _Entry, aliases: set[str], report: _Report) -> ApiKey:
    secret = _secret(_Entry(entry.source, (*entry.path, "key"), entry.value["key"]), report)
    models = entry.value.get("models")
    _check_names(entry, ("models",), models, aliases, "model alias", report)
    digest = key_digest(secret) if secret else b""
    limits = _rate_limits(entry, ("limits",), entry.value.get("limits"), report)
    return ApiKey(entry.value["name"], digest, entry.value.get("team"), _frozen(models), limits)


def _check_unique_keys(
    entries: Sequence[_Entry],
    api_keys: Sequence[ApiKey],
    admin_digest: bytes | None,
    report: _Report,
) -> None:
    by_name: dict[str, _Entry] = {}
    by_digest: dict[bytes, _Entry] = {}
    for entry, key in zip(entries, api_keys, strict=True):
        if key.name in by_name:
            message = (
                f"duplicate api key name {key.name!r}; first defined at {by_name[key.name].where}"
            )
            report.errors.append(entry.issue(("name",), message))
        if key.digest in by_digest:  # the message never shows the key itself
            report.errors.append(
                entry.issue(("key",), f"same key as {by_digest[key.digest].where}")
            )
        elif key.digest == admin_digest:
            report.errors.append(entry.issue(("key",), "same key as keys.admin_key"))
        by_name.setdefault(key.name, entry)
        if key.digest:  # b"" stands for an unset variable, already reported
            by_digest.setdefault(key.digest, entry)


def _secret(entry: _Entry, report: _Report) -> str | None:
    """A key's value; an unset or empty variable is an error (an empty key must never match)."""
    name = _env_name(entry.value)
    if name is None:
        return str(entry.value)
    value = report.environ.get(name)
    if not value:
        state = "is not set" if value is None else "is empty"
        report.errors.append(entry.issue((), f"environment variable {name!r} {state}"))
    return value or None


def _policies(
    entries: Sequence[_Entry],
    aliases: set[str],
    key_names: set[str],
    report: _Report,
    defaults: PolicyDefaults,
) -> tuple[Policy, ...]:
    by_name: dict[str, _Entry] = {}
    for entry in entries:
        name: str = entry.value["name"]
        if name in by_name:
            message = f"duplicate policy name {name!r}; first defined at {by_name[name].where}"
            report.errors.append(entry.issue(("name",), message))
        by_name.setdefault(name, entry)
    return tuple(_policy(entry, aliases, key_names, report, defaults) for entry in entries)


def _policy(
    entry: _Entry,
    aliases: set[str],
    key_names: set[str],
    report: _Report,
    defaults: PolicyDefaults,
) -> Policy:
    raw = entry.value
    match = raw.get("match", {})
    models, keys = match.get("models"), match.get("keys")
    _check_names(entry, ("match", "models"), models, aliases, "model alias", report)
    _check_names(entry, ("match", "keys"), keys, key_names, "api key", report)
    headers = tuple((name.lower(), value) for name, value in match.get("headers", {}).items())
    summarizer = raw.get("compaction", {}).get("summarizer_model")
    if summarizer is not None:
        _check_names(
            entry, ("compaction", "summarizer_model"), [summarizer], aliases, "model alias",
            report, indexed=False,
        )  # fmt: skip
    return Policy(
        name=raw["name"],
        match=PolicyMatch(_frozen(models), _frozen(keys), headers),
        mode=raw.get("mode", "enforce"),
        description=raw.get("description", ""),
        repair=_section(RepairSpec, raw.get("repair")),
        offload=_section(OffloadSpec, raw.get("offload")),
        compaction=_compaction(entry, raw.get("compaction"), report),
        recall=_section(RecallSpec, raw.get("recall")),
        retry=_retry({**defaults.retry, **raw.get("retry", {})}),
        fallbacks=_fallbacks(entry, raw.get("fallbacks", []), aliases, report, defaults),
        routing=_section(RoutingSpec, raw.get("routing")),
        circuit=_section(CircuitSpec, {**defaults.circuit, **raw.get("circuit", {})}),
        loops=_loops(entry, raw.get("loops"), report),
        budgets=tuple(_budget(entry, i, b, report) for i, b in enumerate(raw.get("budgets", []))),
        limits=_policy_limits(entry, raw.get("limits"), report),
        record=_record(entry, raw.get("record"), report),
        guard=_guard(entry, raw.get("guard"), report),
        degraded=raw.get("degraded", False),
    )


def _record(entry: _Entry, raw: dict[str, Any] | None, report: _Report) -> RecordSpec:
    """The record section, its redaction patterns compiled into one alternation."""
    spec = _section(RecordSpec, raw)
    for index, pattern in enumerate(spec.redact):
        try:
            re.compile(pattern)
        except re.error as exc:
            message = f"not a regular expression: {exc}"
            report.errors.append(entry.issue(("record", "redact", index), message))
            return spec
    if not spec.redact:
        return spec
    joined = "|".join(f"(?:{pattern})" for pattern in spec.redact)
    return replace(spec, redact_pattern=re.compile(joined))


def _guard(entry: _Entry, raw: dict[str, Any] | None, report: _Report) -> GuardSpec:
    """The guard section: its secret patterns and its tool-call rules' patterns compiled
    (one that does not is named by its YAML path)."""
    raw = raw or {}
    secrets = _section(SecretsSpec, raw.get("secrets"))
    for index, pattern in enumerate(secrets.patterns):
        _rule_pattern(entry, ("guard", "secrets", "patterns", index), pattern, report)
    rules = []
    for index, rule in enumerate(raw.get("tool_calls", [])):
        match = rule["match"]
        path: YamlPath = ("guard", "tool_calls", index, "match")
        tool, arguments = match.get("tool"), match.get("arguments")
        tool_pattern = None
        if tool is not None and len(tool) > 2 and tool.startswith("/") and tool.endswith("/"):
            tool_pattern = _rule_pattern(entry, (*path, "tool"), tool[1:-1], report)
        rules.append(
            ToolCallRule(
                action=rule["action"],
                tool=tool,
                tool_pattern=tool_pattern,
                arguments=None
                if arguments is None
                else _rule_pattern(entry, (*path, "arguments"), arguments, report),
                reason=rule.get("reason", ""),
                label=rule.get("name", str(index)),
            )
        )
    return GuardSpec(mode=raw.get("mode", "enforce"), secrets=secrets, tool_calls=tuple(rules))


def _rule_pattern(
    entry: _Entry, path: YamlPath, pattern: str, report: _Report
) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error as exc:
        report.errors.append(entry.issue(path, f"not a regular expression: {exc}"))
        return None


def _compaction(entry: _Entry, raw: dict[str, Any] | None, report: _Report) -> CompactionSpec:
    spec = _section(CompactionSpec, raw)
    if "target" not in (raw or {}):  # the default, under any trigger
        spec = replace(spec, target=min(spec.target, round(0.6 * spec.trigger, 3)))
    elif spec.target >= spec.trigger:
        message = (
            f"target ({spec.target:g}) must be under trigger ({spec.trigger:g}): a compaction "
            "that stops at the trigger starts again on the next turn"
        )
        report.errors.append(entry.issue(("compaction", "target"), message))
    if spec.intent is not None:
        try:
            re.compile(spec.intent, re.MULTILINE)
        except re.error as exc:
            message = f"not a regular expression: {exc}"
            report.errors.append(entry.issue(("compaction", "intent"), message))
    return spec


def _budget(entry: _Entry, index: int, raw: dict[str, Any], report: _Report) -> BudgetSpec:
    if raw.get("window", "lifetime") != "lifetime" and "wall_s" in raw["limits"]:
        message = "wall_s measures a scope's whole life; use it with window: lifetime"
        report.errors.append(entry.issue(("budgets", index, "limits", "wall_s"), message))
    downgrade = raw.get("on_exhausted", {}).get("model")
    return BudgetSpec(**{**raw, "limits": dict(raw["limits"]), "on_exhausted": downgrade})


def _check_downgrades(
    entries: list[_Entry],
    policies: tuple[Policy, ...],
    aliases: set[str],
    keys: tuple[ApiKey, ...],
    report: _Report,
) -> None:
    """A budget's `on_exhausted` alias must be configured, and open to every key the policy
    may serve: a key limited to `models` without it would be refused where the policy means
    to downgrade, so the load names the conflict."""
    for entry, policy in zip(entries, policies, strict=True):
        for index, spec in enumerate(policy.budgets):
            alias = spec.on_exhausted
            if alias is None:
                continue
            path = ("budgets", index, "on_exhausted", "model")
            if alias not in aliases:
                message = f"unknown model alias {alias!r}{_suggest(alias, aliases)}"
                report.errors.append(entry.issue(path, message))
                continue
            barred = [key.name for key in keys if _barred(key, policy.match, alias)]
            if barred:
                message = (
                    f"api key(s) {', '.join(barred)} may use this policy but not {alias!r} "
                    "(their `models`): add it to their models, or match the policy to keys "
                    "that may use it"
                )
                report.errors.append(entry.issue(path, message))


def _barred(key: ApiKey, match: PolicyMatch, alias: str) -> bool:
    """Whether `key` may be served by a policy matching `match` but may not use `alias`."""
    if key.models is None or alias in key.models:
        return False
    if match.keys is not None and key.name not in match.keys:
        return False
    return match.models is None or bool(match.models & key.models)


def _policy_limits(entry: _Entry, raw: dict[str, Any] | None, report: _Report) -> PolicyLimits:
    """A policy's `limits`: one RateLimits block per scope (`global` is a Python keyword)."""
    blocks = {
        ("global_" if scope == "global" else scope): _rate_limits(
            entry, ("limits", scope), (raw or {}).get(scope), report
        )
        for scope in LIMIT_SCOPES
    }
    return PolicyLimits(**blocks)


def _rate_limits(
    entry: _Entry, path: YamlPath, raw: dict[str, Any] | None, report: _Report
) -> RateLimits | None:
    if raw is None:
        return None
    if not any(name in raw for name in ("rpm", "tpm", "max_concurrent")):
        message = "needs at least one limit: rpm, tpm or max_concurrent"
        report.errors.append(entry.issue(path, message))
    return RateLimits(**raw)


def _retry(raw: dict[str, Any] | None) -> RetrySpec:
    raw = dict(raw or {})
    by_class = raw.pop("classify", {})
    classify = {status: kind for kind, statuses in by_class.items() for status in statuses}
    return RetrySpec(**raw, classify=classify)


def _fallbacks(
    entry: _Entry,
    raws: list[dict[str, Any]],
    aliases: set[str],
    report: _Report,
    defaults: PolicyDefaults,
) -> tuple[FallbackSpec, ...]:
    """A policy's chains, then the defaults' for what they leave: one chain per (alias, class)."""
    own = [_fallback(entry, i, raw, aliases, report) for i, raw in enumerate(raws)]
    for index, spec in enumerate(own):
        for earlier in own[:index]:
            overlap = [k for k in spec.when if earlier.source == spec.source and k in earlier.when]
            if overlap:
                message = (
                    f"{spec.source!r} already falls back on {', '.join(overlap)} "
                    f"(fallbacks[{own.index(earlier)}]); give each chain its own `when`"
                )
                report.errors.append(entry.issue(("fallbacks", index, "from"), message))
                break
    covered = {(spec.source, kind) for spec in own for kind in spec.when}
    inherited = [
        spec for spec in defaults.fallbacks
        if not any((spec.source, kind) in covered for kind in spec.when)
    ]  # fmt: skip
    return (*own, *inherited)


def _fallback(
    entry: _Entry, index: int, raw: dict[str, Any], aliases: set[str], report: _Report
) -> FallbackSpec:
    path = ("fallbacks", index)
    _check_names(
        entry, (*path, "from"), [raw["from"]], aliases, "model alias", report, indexed=False
    )
    _check_names(entry, (*path, "to"), raw["to"], aliases, "model alias", report)
    if raw["from"] in raw["to"]:
        report.errors.append(
            entry.issue((*path, "to"), f"{raw['from']!r} cannot fall back to itself")
        )
    when = tuple(raw.get("when", ("transient", "overflow")))
    return FallbackSpec(source=raw["from"], to=tuple(raw["to"]), when=when)


def _loops(entry: _Entry, raw: dict[str, Any] | None, report: _Report) -> LoopSpec:
    spec = _section(LoopSpec, raw)
    if spec.repeats > spec.window:
        message = f"repeats ({spec.repeats}) cannot exceed window ({spec.window})"
        report.errors.append(entry.issue(("loops", "repeats"), message))
    return spec


def _section(kind: type[SectionT], raw: dict[str, Any] | None) -> SectionT:
    """A policy section from its (schema-checked) mapping; lists become tuples."""
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in (raw or {}).items()}
    return kind(**values)


def _check_names(
    entry: _Entry,
    path: YamlPath,
    names: list[str] | None,
    known: set[str],
    kind: str,
    report: _Report,
    *,
    indexed: bool = True,
) -> None:
    for index, name in enumerate(names or ()):
        if name not in known:
            message = f"unknown {kind} {name!r}{_suggest(name, known)}"
            report.errors.append(entry.issue((*path, index) if indexed else path, message))


def _env_name(value: object) -> str | None:
    if isinstance(value, str) and value.startswith(ENV_PREFIX):
        return value.removeprefix(ENV_PREFIX)
    return None


def _is_http_url(value: str) -> bool:
    try:
        parts = urlsplit(value)
    except ValueError:  # e.g. an unclosed "[" of an IPv6 address
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _headers(values: dict[str, str | None] | None) -> dict[str, str]:
    # A header whose variable is unset (already warned about) is left out, not sent empty.
    return {name: value for name, value in (values or {}).items() if value is not None}


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _frozen(values: list[str] | None) -> frozenset[str] | None:
    return None if values is None else frozenset(values)
