"""What the proxy learnt about the operator's deployments from their own answers: the routes a
deployment lacks (missing_routes.py: /v1/chat/completions, no_chat.py; a wire's native route,
which its native upstream names) and whether it refuses a null content
(proxy/pipeline/compat.py). One object per app (its FACTS key), made in the app's setup and
handed to what reads or teaches it: two apps in one process learn apart. Facts about a
deployment (its model and address, so a config reload keeps them), not about anyone's data:
every tenant's requests to it see them alike."""

from __future__ import annotations

from cachetools import LRUCache

from proxy.policies.spec import Deployment
from proxy.upstream import no_chat
from proxy.upstream.missing_routes import MissingRoute

SIZE = 4096  # deployments remembered per fact (those of configs long replaced fall out)


class DeploymentFacts:
    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        # One that serves only Responses: chat clients and summaries go as Responses.
        self.no_chat = MissingRoute(no_chat.ROUTE, no_chat.THEN, size, no_chat.PHRASES)
        # A server that answers a null content with an error naming it (llama-cpp-python).
        self.no_null_content: LRUCache[tuple[str, str | None], bool] = LRUCache(size)
        self._native: dict[str, MissingRoute] = {}  # by wire name

    def native_route(self, wire: str, route: str, then: str) -> MissingRoute:
        """The deployments learnt to lack `wire`'s native `route` (an OpenAI-compatible
        server without /v1/responses): that wire's clients then go translated to chat. Named
        by the wire's own modules, the first time they ask."""
        found = self._native.get(wire)
        if found is None:
            found = self._native[wire] = MissingRoute(route, then, self.size)
        return found

    def lacks_native_route(self, wire: str, deployment: Deployment) -> bool:
        found = self._native.get(wire)
        return found is not None and found.lacked_by(deployment)

    def learn_native_route(
        self, wire: str, deployment: Deployment, status: int, body: bytes
    ) -> bool:
        """After the deployment's answer on `wire`'s native route: True when it lacks it."""
        found = self._native.get(wire)
        return found is not None and found.learn(deployment, status, body)


def as_chat_note(wire: str) -> str:
    """The note of a request sent as chat for its deployment lacks its wire's native route."""
    return f"{wire}_as_chat"
