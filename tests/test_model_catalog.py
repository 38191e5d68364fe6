"""The catalog's facts per deployment: built once, forgotten when litellm's map is read."""

from __future__ import annotations

import dataclasses

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
