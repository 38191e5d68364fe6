"""Fakes for control's unit tests: a clock and sleep that never wait, a scripted upstream."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from proxy.control.backoff import Timing
from proxy.exchange import Exchange, Identity, Usage
from proxy.policies.spec import Config, Deployment, Policy
from proxy.upstream.base import Upstream, UpstreamReply
from tests.pipeline.factories import deployment

REPLY = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}


class Clock:
    """Time moves only when the code under test sleeps (or the test says so)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def timing(self) -> Timing:
        # Jitter off: every backoff is its ceiling, so tests can check exact values.
        return Timing(clock=self, sleep=self.sleep, jitter=lambda top: top, wall=lambda: 0.0)


class Script:
    """An upstream answering from a list of outcomes, in order (exceptions are raised); once
    the list is empty, every call succeeds."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, dict[str, Any]]] = []  # (deployment.upstream_model, body)

    async def complete(
        self,
        deployment: Deployment,
        body: dict[str, Any],
        request_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> UpstreamReply:
        self.calls.append((deployment.upstream_model, {**body}))
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if isinstance(outcome, BaseException):
            raise outcome
        if callable(outcome):
            return await outcome()  # type: ignore[no-any-return]
        return UpstreamReply(REPLY, orjson.dumps(REPLY))

    async def open_stream(
        self,
        deployment: Deployment,
        body: dict[str, Any],
        request_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        return await self.complete(deployment, body, request_id)

    @staticmethod
    def usage(data: dict[str, Any]) -> Usage | None:
        return Usage.of(data.get("usage"))

    async def close(self) -> None:
        return None


class Router:
    """First usable deployment (no round-robin: tests want to know which one)."""

    def __init__(self, upstream: Script) -> None:
        self.upstream = upstream

    def pick(
        self,
        deployments: tuple[Deployment, ...],
        usable: Callable[[Deployment], bool] | None = None,
    ) -> Deployment:
        return next((d for d in deployments if usable is None or usable(d)), deployments[0])

    def for_deployment(self, deployment: Deployment, wire: str = "chat") -> Upstream:
        return self.upstream


def exchange(
    policy: Policy,
    groups: dict[str, tuple[Deployment, ...]] | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> Exchange:
    groups = groups or {"sim": (deployment(alias="sim"),), "backup": (deployment(alias="backup"),)}
    ex = Exchange(
        identity=Identity("req-1", session="s1"),
        config=Config(version="t", sources=(), loaded_at=0, deployments=groups),
        body={"model": "sim", "messages": messages or [{"role": "user", "content": "hi"}]},
        alias="sim",
        policy=policy,
    )
    ex.deployment = groups["sim"][0]
    return ex
