"""Usage as each wire reports it, and its price at the prompt cache's own rates."""

from __future__ import annotations

import pytest

from proxy.exchange import Usage
from proxy.model_catalog import ModelCatalog
from proxy.wire.registry import WIRES
from tests.pipeline.factories import deployment

CASES = {
    "chat": (
        {
            "prompt_tokens": 100,
            "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 60},
        },
        Usage(100, 7, 60, 0),
    ),
    "chat without details": ({"prompt_tokens": 100, "completion_tokens": 7}, Usage(100, 7)),
    "responses": (
        {"input_tokens": 100, "output_tokens": 7, "input_tokens_details": {"cached_tokens": 60}},
        Usage(100, 7, 60, 0),
    ),
    "anthropic": (
        {
            "input_tokens": 10,
            "cache_read_input_tokens": 60,
            "cache_creation_input_tokens": 30,
            "output_tokens": 7,
        },
        Usage(100, 7, 60, 30),
    ),
    "garbage": ({"prompt_tokens": "many"}, None),
}


WIRE_OF = {"chat": "chat", "chat without details": "chat", "garbage": "chat"}


@pytest.mark.parametrize("case", list(CASES))
def test_usage_is_read_from_every_wire(case: str) -> None:
    reported, expected = CASES[case]
    wire = next(w for w in WIRES if w.name == WIRE_OF.get(case, case))
    assert wire.usage(reported) == expected


@pytest.mark.parametrize("wire", WIRES, ids=lambda wire: wire.name)
def test_every_wire_reads_a_chat_usage(wire: object) -> None:
    """A translated call answers in chat's shape, whatever the client's wire."""
    reported, expected = CASES["chat"]
    assert wire.usage(reported) == expected  # type: ignore[attr-defined]


def test_cached_reads_and_cache_writes_are_priced_at_their_own_rates() -> None:
    import dataclasses

    priced = dataclasses.replace(
        deployment(),
        input_cost_per_token=3e-6,
        output_cost_per_token=15e-6,
        cache_read_cost_per_token=0.3e-6,
        cache_write_cost_per_token=3.75e-6,
    )
    usage = Usage(100, 10, cache_read=60, cache_write=30)
    cost = ModelCatalog().cost(priced, usage)
    assert cost == pytest.approx(10 * 3e-6 + 60 * 0.3e-6 + 30 * 3.75e-6 + 10 * 15e-6)
    plain = dataclasses.replace(
        priced, cache_read_cost_per_token=None, cache_write_cost_per_token=None
    )
    assert ModelCatalog().cost(plain, usage) == pytest.approx(100 * 3e-6 + 10 * 15e-6)
