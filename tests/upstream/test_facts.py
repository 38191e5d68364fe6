"""Learnt deployment facts are the app's: one object per app, made in its setup, so two proxies
in one process (or a test's two apps) learn apart."""

from __future__ import annotations

from pathlib import Path

import orjson

from proxy.app import build_app, summary_wires
from proxy.policies.spec import Deployment
from proxy.state import FACTS, UPSTREAMS
from proxy.wire.responses.upstream import no_responses
from tests.conftest import sim_config

NOT_FOUND = orjson.dumps({"detail": "Not Found"})
TARGET = Deployment(
    alias="m", model="openai/m", provider="openai", upstream_model="m",
    api_base="http://127.0.0.1:1/v1", api_key="k",
)  # fmt: skip


def test_a_fact_one_app_learnt_is_not_anothers(tmp_path: Path) -> None:
    config = tmp_path / "agentproxy.yaml"
    config.write_text(sim_config("http://127.0.0.1:1"))
    first, second = build_app(config, watch=False), build_app(config, watch=False)
    assert first[FACTS] is not second[FACTS]
    learning, other = summary_wires(first[UPSTREAMS]), summary_wires(second[UPSTREAMS])
    assert learning.learn_no_chat(TARGET, 404, NOT_FOUND)
    assert learning.choose("chat", TARGET) is not None  # it goes as Responses there now
    assert other.choose("chat", TARGET) is None  # the second app still sends chat
    responses = second[UPSTREAMS].natives["responses"]
    assert no_responses(first[FACTS]).learn(TARGET, 404, NOT_FOUND)
    assert responses.speaks(TARGET)  # the second app never learnt it
    assert not first[UPSTREAMS].natives["responses"].speaks(TARGET)
