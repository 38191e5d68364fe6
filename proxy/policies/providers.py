"""Which provider a model string names, and the provider's key from the environment.

LiteLLM accepts a bare model name ("gpt-4o", no "openai/" in front) and finds its provider in
its model map; it reads a provider's key from a conventional environment variable when a
deployment names none. A LiteLLM config.yaml relies on both, so the loader does the same.

The map is read as JSON from litellm's package folder (litellm is never imported here: seconds
and ~190 MB) and only when a bare name appears; just the few thousand bare names are kept.
`tests/policies/test_providers.py` checks the answers against `litellm.get_llm_provider`.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import NamedTuple

import orjson

PRICE_MAP = "model_prices_and_context_window_backup.json"  # shipped inside the litellm package

# The variables litellm reads a provider's key from, first found wins (its own order).
KEY_VARIABLES: Mapping[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "gemini": ("GEMINI_API_KEY",),
    "groq": ("GROQ_API_KEY",),
    "deepseek": ("DEEPSEEK_API_KEY",),
    "xai": ("XAI_API_KEY",),
    "together_ai": (
        "TOGETHER_API_KEY", "TOGETHER_AI_API_KEY", "TOGETHERAI_API_KEY", "TOGETHER_AI_TOKEN",
    ),
    "fireworks_ai": (
        "FIREWORKS_API_KEY", "FIREWORKS_AI_API_KEY", "FIREWORKSAI_API_KEY", "FIREWORKS_AI_TOKEN",
    ),
    "openrouter": ("OPENROUTER_API_KEY", "OR_API_KEY"),
    "lm_studio": ("LM_STUDIO_API_KEY",),
    "hosted_vllm": ("HOSTED_VLLM_API_KEY",),
}  # fmt: skip

# The map's provider names that litellm's router spells otherwise.
_RENAMED = {"bedrock_converse": "bedrock", "ai21": "ai21_chat"}
_CATEGORY = re.compile(r"-[a-z_-]*models$")  # "vertex_ai-language-models" is vertex_ai
_PROVIDER_NAME = re.compile(r"[a-z0-9_]+(?:-[a-z0-9_]+)*")  # not the map's sample entry


class Inferred(NamedTuple):
    provider: str
    how: str  # for the note that says so: "litellm's model map", "guessed", ...


class _Index(NamedTuple):
    providers: dict[str, str]  # bare name -> provider, as the map says
    aliases: dict[str, str]  # "claude-sonnet-latest" -> the name it stands for
    rules: tuple[tuple[re.Pattern[str], str], ...]  # litellm's routing rules, in order


def split_model(model: str, custom_provider: str | None) -> tuple[str, str, str | None]:
    """(provider, upstream model, how it was inferred or None when written) of litellm_params'
    `model` and `custom_llm_provider`; ("", "", None) when the string names no model at all."""
    if custom_provider and not model.startswith(f"{custom_provider}/"):
        return custom_provider, model, None  # litellm prefixes it the same way
    provider, slash, name = model.partition("/")
    if slash:
        return (provider, name, None) if provider and name else ("", "", None)
    if not model:
        return "", "", None
    inferred = infer_provider(model)
    return inferred.provider, model, inferred.how


def infer_provider(model: str) -> Inferred:
    """The provider litellm would pick for a bare name; openai when it knows the name not."""
    index = _index()
    name = index.aliases.get(model, model)
    if name in index.providers:
        return Inferred(index.providers[name], "litellm's model map")
    if model.startswith(("ft:gpt-", "ft:o")):  # fine-tunes, named by their base model
        return Inferred("openai", "an OpenAI fine-tune")
    for pattern, provider in index.rules:
        if pattern.search(model):
            return Inferred(provider, "litellm's routing rules")
    return Inferred("openai", "guessed")


def provider_key(provider: str, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, key) litellm would use for `provider`, from `environ`; None when unset."""
    for variable in KEY_VARIABLES.get(provider, ()):
        value = environ.get(variable)
        if value:
            return variable, value
    return None


def _normalized(provider: str) -> str:
    provider = _RENAMED.get(provider, provider)
    return provider if provider.startswith("text-completion") else _CATEGORY.sub("", provider)


@cache
def _index() -> _Index:
    spec = importlib.util.find_spec("litellm")  # locates the package without importing it
    if spec is None or spec.origin is None:
        return _Index({}, {}, ())
    try:
        entries = orjson.loads((Path(spec.origin).parent / PRICE_MAP).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return _Index({}, {}, ())
    return _index_of(entries)


def _index_of(entries: dict[str, object]) -> _Index:
    providers: dict[str, str] = {}
    aliases: dict[str, str] = {}
    for name, entry in entries.items():
        if "/" in name or not isinstance(entry, dict):
            continue
        provider, alias_of = entry.get("litellm_provider"), entry.get("alias_of")
        if isinstance(provider, str) and _PROVIDER_NAME.fullmatch(provider):
            providers[name] = _normalized(provider)
        elif isinstance(alias_of, str):
            aliases[name] = alias_of
    return _Index(providers, aliases, _routing_rules(entries.get("fallback_generalizations")))


def _routing_rules(section: object) -> tuple[tuple[re.Pattern[str], str], ...]:
    """Rules whose model_info is only a provider decide a bare name no entry matched."""
    rules = section.get("rules", []) if isinstance(section, dict) else []
    found: list[tuple[re.Pattern[str], str]] = []
    for rule in rules if isinstance(rules, list) else []:
        info = rule.get("model_info") if isinstance(rule, dict) else None
        pattern = rule.get("pattern") if isinstance(rule, dict) else None
        if not (isinstance(info, dict) and list(info) == ["litellm_provider"]):
            continue
        if "fill_missing_for_providers" in rule or not isinstance(pattern, str):
            continue
        try:
            found.append((re.compile(pattern, re.IGNORECASE), str(info["litellm_provider"])))
        except re.error:
            continue
    return tuple(found)
