"""The catalog's facts per deployment: built once, forgotten when litellm's map is read."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from proxy import model_catalog
from proxy.model_catalog import ModelCatalog, ModelFacts
from tests.pipeline.factories import deployment


async def test_facts_are_built_once_per_deployment_and_rebuilt_after_the_map_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    catalog = ModelCatalog()
    one = dataclasses.replace(deployment(), max_input_tokens=None)
    first = catalog.facts(one)
    assert first.max_input_tokens is None
    assert catalog.facts(one) is first  # remembered, not built again
    known = {one.model: ModelFacts(1000, 1e-6, 2e-6)}
    monkeypatch.setattr(model_catalog, "_read_price_map", lambda: known)
    catalog.load_in_background()
    await catalog.ready()
    assert catalog.facts(one).max_input_tokens == 1000  # the map read: nothing stale kept
    # An equal deployment of another config is another object: its own entry, same facts.
    twin = dataclasses.replace(one)
    assert catalog.facts(twin) == catalog.facts(one)


def test_remembered_facts_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_catalog, "MAX_REMEMBERED", 4)
    catalog = ModelCatalog()
    kept = [dataclasses.replace(deployment(), max_input_tokens=n) for n in range(1, 11)]
    for n, d in enumerate(kept, start=1):
        assert catalog.facts(d).max_input_tokens == n
        assert len(catalog._facts) <= 4


async def test_capabilities_come_from_model_info_then_the_map_and_unknown_stays_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    entries = {
        "plain": {"max_output_tokens": 4096, "supports_vision": False, "supports_reasoning": False},
        "seeing": {"supports_vision": True, "supports_function_calling": True},
    }
    (tmp_path / model_catalog.PRICE_MAP).write_bytes(orjson.dumps(entries))
    spec = SimpleNamespace(origin=str(tmp_path / "__init__.py"))
    monkeypatch.setattr(model_catalog.importlib.util, "find_spec", lambda name: spec)
    known = model_catalog._read_price_map()
    plain = known["plain"]
    assert (plain.max_output_tokens, plain.supports_vision, plain.supports_reasoning) == (
        4096, False, False
    )  # fmt: skip
    assert plain.supports_function_calling is None and plain.supports_pdf_input is None
    assert known["seeing"].supports_vision is True

    monkeypatch.setattr(model_catalog, "_read_price_map", lambda: known)
    catalog = ModelCatalog()
    catalog.load_in_background()
    await catalog.ready()
    mapped = dataclasses.replace(deployment(), model="openai/x", upstream_model="plain")
    assert catalog.facts(mapped).supports_vision is False
    assert catalog.facts(mapped).max_output_tokens == 4096
    told = dataclasses.replace(mapped, supports_vision=True, max_output_tokens=1000)
    assert catalog.facts(told).supports_vision is True  # model_info wins over the map
    assert catalog.facts(told).max_output_tokens == 1000
    nobody = dataclasses.replace(deployment(), model="openai/y", upstream_model="y")
    facts = catalog.facts(nobody)
    assert facts.supports_vision is None and facts.supports_function_calling is None
