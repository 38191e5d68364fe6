"""Context windows and prices: the config's model_info first, then litellm's bundled price map.

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


class ModelFacts(NamedTuple):
    max_input_tokens: int | None
    input_cost_per_token: float | None
    output_cost_per_token: float | None


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
        )
        for name, entry in entries.items()
        if isinstance(entry, dict)
    }


class ModelCatalog:
    def __init__(self) -> None:
        self._known: dict[str, ModelFacts] = {}
        self._loading: asyncio.Task[None] | None = None

    def load_in_background(self) -> None:
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load())

    async def _load(self) -> None:
        self._known = await asyncio.to_thread(_read_price_map)

    async def close(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()

    def facts(self, deployment: Deployment) -> ModelFacts:
        known = self._known.get(deployment.model) or self._known.get(deployment.upstream_model)
        if known is None:
            known = ModelFacts(None, None, None)
        return ModelFacts(
            _first(deployment.max_input_tokens, known.max_input_tokens),
            _first(deployment.input_cost_per_token, known.input_cost_per_token),
            _first(deployment.output_cost_per_token, known.output_cost_per_token),
        )

    def cost(self, deployment: Deployment, usage: Usage) -> float | None:
        facts = self.facts(deployment)
        if facts.input_cost_per_token is None or facts.output_cost_per_token is None:
            return None
        return (
            usage.prompt_tokens * facts.input_cost_per_token
            + usage.completion_tokens * facts.output_cost_per_token
        )


def _first(configured: T | None, known: T | None) -> T | None:
    return configured if configured is not None else known
