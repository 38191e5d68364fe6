"""Factory-built exchanges and stage contexts, as the stage tests need them."""

from __future__ import annotations

from typing import Any

from proxy.exchange import Exchange, Identity
from proxy.messages import Message
from proxy.metrics import Metrics
from proxy.model_catalog import ModelCatalog
from proxy.pipeline.base import StageContext
from proxy.policies.spec import Config, Deployment, Policy
from proxy.recording.events import EventLog
from proxy.store.base import Store
from proxy.store.memory import MemoryStore


def deployment(window: int | None = 8192, alias: str = "sim") -> Deployment:
    return Deployment(
        alias=alias,
        model=f"openai/{alias}",
        provider="openai",
        upstream_model=alias,
        api_base="http://127.0.0.1:9/v1",
        api_key=None,
        max_input_tokens=window,
    )


def exchange(
    messages: list[Message], policy: Policy | None = None, session: str = "s1", **body: Any
) -> Exchange:
    target = deployment()
    ex = Exchange(
        identity=Identity("req-1", session=session),
        config=Config(version="t", sources=(), loaded_at=0, deployments={"sim": (target,)}),
        body={"model": "sim", "messages": messages, **body},
        alias="sim",
        policy=policy or Policy(name="test"),
    )
    ex.deployment = target
    return ex


async def _no_summaries(ex: Exchange, messages: list[Message], room: int) -> str:
    raise RuntimeError("no summarizer in this test")


def context(store: Store | None = None, events: EventLog | None = None) -> StageContext:
    return StageContext(
        store=store or MemoryStore(),
        catalog=ModelCatalog(),
        metrics=Metrics(),
        events=events or EventLog(None),
        summarize=_no_summaries,
    )
