"""Picks the deployment and upstream that serve a request."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from proxy.policies.spec import Config, Deployment, ServerSettings
from proxy.upstream.base import Upstream
from proxy.upstream.litellm import LiteLLMUpstream
from proxy.upstream.openai_compat import OpenAICompatUpstream
from proxy.wire.anthropic.upstream import AnthropicUpstream, speaks_anthropic
from proxy.wire.responses.upstream import ResponsesUpstream, speaks_responses


class Upstreams:
    def __init__(self, settings: Callable[[], ServerSettings]) -> None:
        self.fast = OpenAICompatUpstream(settings)
        self.anthropic = AnthropicUpstream(settings)
        self.responses = ResponsesUpstream(settings)
        self.litellm = LiteLLMUpstream(settings)
        self._turns: dict[str, itertools.count[int]] = {}

    def pick(
        self,
        deployments: tuple[Deployment, ...],
        usable: Callable[[Deployment], bool] | None = None,
    ) -> Deployment:
        """Round-robin over an alias' deployments, skipping those `usable` rejects (open
        circuits); when it rejects them all, the plain round-robin choice."""
        if len(deployments) == 1:
            return deployments[0]
        turn = self._turns.setdefault(deployments[0].alias, itertools.count())
        start = next(turn)
        if usable is not None:
            for offset in range(len(deployments)):
                candidate = deployments[(start + offset) % len(deployments)]
                if usable(candidate):
                    return candidate
        return deployments[start % len(deployments)]

    def for_deployment(self, deployment: Deployment, wire: str = "chat") -> Upstream:
        """The client's own wire where the deployment speaks it; else OpenAI chat (the fast
        path, or litellm's translation to the provider)."""
        if wire == "anthropic" and speaks_anthropic(deployment):
            return self.anthropic
        if wire == "responses" and speaks_responses(deployment):
            return self.responses
        return self.fast if deployment.fast_path else self.litellm

    def prepare(self, config: Config) -> None:
        """Start importing litellm in the background if any deployment will need it."""
        if any(_warms_litellm(d) for group in config.deployments.values() for d in group):
            self.litellm.warm_up()

    def ready(self, config: Config) -> bool:
        needs_litellm = any(_warms_litellm(d) for g in config.deployments.values() for d in g)
        return self.litellm.loaded or not needs_litellm

    async def close(self) -> None:
        await self.fast.close()
        await self.anthropic.close()
        await self.responses.close()
        await self.litellm.close()


def _warms_litellm(deployment: Deployment) -> bool:
    """Whether litellm is imported at start for this deployment (seconds, ~150 MB). An
    Anthropic deployment is mostly called natively by Anthropic clients: litellm is then
    imported on first need (an OpenAI client of it, its summaries), not at start."""
    return not deployment.fast_path and not speaks_anthropic(deployment)
