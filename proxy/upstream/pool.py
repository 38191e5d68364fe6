"""Picks the deployment and upstream that serve a request."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Protocol

from proxy.messages import CHAT
from proxy.policies.spec import Config, Deployment, ServerSettings
from proxy.upstream.base import Upstream
from proxy.upstream.facts import DeploymentFacts
from proxy.upstream.litellm import LiteLLMUpstream
from proxy.upstream.openai_compat import OpenAICompatUpstream


class NativeUpstream(Upstream, Protocol):
    """A wire format's own upstream (proxy/wire/<format>/upstream.py): it serves that wire's
    clients natively on the deployments it speaks to."""

    wire: str

    def speaks(self, deployment: Deployment) -> bool: ...


# Made with the live server settings and the app's learnt facts about its deployments.
NativeFactory = Callable[[Callable[[], ServerSettings], DeploymentFacts], NativeUpstream]


class Upstreams:
    def __init__(
        self,
        settings: Callable[[], ServerSettings],
        natives: Iterable[NativeFactory] = (),
        facts: DeploymentFacts | None = None,
    ) -> None:
        self.facts = facts if facts is not None else DeploymentFacts()  # the app's, shared
        self.fast = OpenAICompatUpstream(settings)
        self.litellm = LiteLLMUpstream(settings)
        # Each wire's native upstream (the registry's, proxy/wire/registry.py), by wire name.
        self.natives: dict[str, NativeUpstream] = {}
        for make in natives:
            native = make(settings, self.facts)
            self.natives[native.wire] = native
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

    def for_deployment(self, deployment: Deployment, wire: str = CHAT) -> Upstream:
        """The client's own wire where its native upstream speaks to the deployment; else
        OpenAI chat (the fast path, or litellm's translation to the provider)."""
        native = self.natives.get(wire)
        if native is not None and native.speaks(deployment):
            return native
        return self.fast if deployment.fast_path else self.litellm

    def prepare(self, config: Config) -> None:
        """Start importing litellm in the background if any deployment will need it."""
        if any(self._warms_litellm(d) for group in config.deployments.values() for d in group):
            self.litellm.warm_up()

    def ready(self, config: Config) -> bool:
        needs = any(self._warms_litellm(d) for g in config.deployments.values() for d in g)
        return self.litellm.loaded or not needs

    async def close(self) -> None:
        await self.fast.close()
        for native in self.natives.values():
            await native.close()
        await self.litellm.close()

    def _warms_litellm(self, deployment: Deployment) -> bool:
        """Whether litellm is imported at start for this deployment (seconds, ~150 MB). A
        deployment a wire's native upstream speaks to (Anthropic's) is mostly called natively
        by that wire's clients: litellm is then imported on first need (a chat client of it,
        its summaries), not at start."""
        if deployment.fast_path:
            return False
        return not any(native.speaks(deployment) for native in self.natives.values())
