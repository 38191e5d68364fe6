"""Context windows, prices and capabilities: the config's model_info first, then litellm's
bundled price map.

A capability (`supports_vision`, ...) is False only when one of them says so; unknown is None,
and whoever reads it assumes the model takes it (a history is never stripped of what may work).

The price map is read as plain JSON from litellm's package folder, so looking up a window or a
price never pays for `import litellm` (seconds, ~190 MB).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from pathlib import Path
from typing import NamedTuple, TypeVar

import orjson

from proxy.exchange import Usage
from proxy.policies.spec import Deployment

log = logging.getLogger("agentproxy.catalog")

T = TypeVar("T")

PRICE_MAP = "model_prices_and_context_window_backup.json"
MAX_REMEMBERED = 1024  # deployments whose facts are kept built


class ModelFacts(NamedTuple):
    max_input_tokens: int | None
    input_cost_per_token: float | None
    output_cost_per_token: float | None
    # Prompt-cache prices: a read, and a write (Anthropic); the input price when unknown.
    cache_read_cost_per_token: float | None = None
    cache_write_cost_per_token: float | None = None
    max_output_tokens: int | None = None
    supports_vision: bool | None = None
    supports_pdf_input: bool | None = None
    supports_function_calling: bool | None = None
    supports_reasoning: bool | None = None


CAPABILITIES = (
    "supports_vision", "supports_pdf_input", "supports_function_calling", "supports_reasoning"
)  # fmt: skip


def _read_price_map() -> dict[str, ModelFacts]:
    spec = importlib.util.find_spec("litellm")  # locates the package without importing it
    if spec is None or spec.origin is None:
        return {}
    path = Path(spec.origin).parent / PRICE_MAP
    try:
        entries = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        log.warning("litellm's price map is unreadable (%s); windows and prices unknown", exc)
        return {}
    return {
        name: ModelFacts(
            entry.get("max_input_tokens"),
            entry.get("input_cost_per_token"),
            entry.get("output_cost_per_token"),
            entry.get("cache_read_input_token_cost"),
            entry.get("cache_creation_input_token_cost"),
            _count(entry.get("max_output_tokens")),
            *(_flag(entry.get(capability)) for capability in CAPABILITIES),
        )
        for name, entry in entries.items()
        if isinstance(entry, dict)
    }


class ModelCatalog:
    def __init__(self) -> None:
        self._known: dict[str, ModelFacts] = {}
        self._loading: asyncio.Task[None] | None = None
        # Each deployment's facts, built once (a request asks two or three times): keyed by
        # the deployment object, which a config keeps alive; emptied when the map is read.
        self._facts: dict[int, tuple[Deployment, ModelFacts]] = {}

    def load_in_background(self) -> None:
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load())

    async def _load(self) -> None:
        self._known = await asyncio.to_thread(_read_price_map)
        self._facts = {}

    async def ready(self) -> None:
        """Wait until litellm's price map is read (tests; requests never wait for it)."""
        if self._loading is not None:
            await asyncio.shield(self._loading)

    async def close(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()

    def facts(self, deployment: Deployment) -> ModelFacts:
        found = self._facts.get(id(deployment))
        if found is not None and found[0] is deployment:
            return found[1]
        facts = self._lookup(deployment)
        if len(self._facts) >= MAX_REMEMBERED:  # reloads make new deployments: stay bounded
            self._facts = {}
        self._facts[id(deployment)] = (deployment, facts)
        return facts

    def _lookup(self, deployment: Deployment) -> ModelFacts:
        known = self._known.get(deployment.model) or self._known.get(deployment.upstream_model)
        if known is None:
            known = ModelFacts(None, None, None)
        return ModelFacts(
            _first(deployment.max_input_tokens, known.max_input_tokens),
            _first(deployment.input_cost_per_token, known.input_cost_per_token),
            _first(deployment.output_cost_per_token, known.output_cost_per_token),
            _first(deployment.cache_read_cost_per_token, known.cache_read_cost_per_token),
            _first(deployment.cache_write_cost_per_token, known.cache_write_cost_per_token),
            _first(deployment.max_output_tokens, known.max_output_tokens),
            *(
                _first(getattr(deployment, capability), getattr(known, capability))
                for capability in CAPABILITIES
            ),
        )

    def cost(self, deployment: Deployment, usage: Usage) -> float | None:
        """The usage priced at the model's rates: cached reads and cache writes at their own
        (the input rate where the model has none), reasoning as output."""
        facts = self.facts(deployment)
        price_in, price_out = facts.input_cost_per_token, facts.output_cost_per_token
        if price_in is None or price_out is None:
            return None
        read = _first(facts.cache_read_cost_per_token, price_in)
        write = _first(facts.cache_write_cost_per_token, price_in)
        assert read is not None and write is not None
        return (
            usage.uncached * price_in
            + usage.cache_read * read
            + usage.cache_write * write
            + usage.completion_tokens * price_out
        )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _first(configured: T | None, known: T | None) -> T | None:
    return configured if configured is not None else known
