"""What the proxy learnt about the operator's deployments from their own answers: the routes a
deployment lacks (missing_routes.py: /v1/chat/completions, no_chat.py; a wire's native route,
which its native upstream names) and whether it refuses a null content
(proxy/pipeline/compat.py). One object per app (its FACTS key), made in the app's setup and
handed to what reads or teaches it: two apps in one process learn apart. Facts about a
deployment (its model and address, so a config reload keeps them), not about anyone's data:
every tenant's requests to it see them alike.

Replicas on a shared state store (Redis) share them (`share`): a fact learnt here is published
(proxy/store/state.py `publish`, valid for FACT_TTL_S) and every replica reads the published
ones each FOLLOW_INTERVAL_S (`follow`), so another replica stops trying a route this one found
missing within about a second. A fact that cannot be published is this replica's alone."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import orjson
from cachetools import LRUCache

from proxy.logs.limit import warn_limited
from proxy.policies.spec import Deployment
from proxy.store.base import StoreError
from proxy.store.state import StateStore
from proxy.upstream import no_chat
from proxy.upstream.missing_routes import DeploymentKey, MissingRoute

log = logging.getLogger("agentproxy.upstream")

SIZE = 4096  # deployments remembered per fact (those of configs long replaced fall out)
SPACE = "deployment_facts"  # published facts: field = [fact, model, api_base], value 1
FACT_TTL_S = 7 * 24 * 3600.0  # a deployment that changed is learnt again a week on at most
FOLLOW_INTERVAL_S = 1.0
NO_CHAT, NO_NULL_CONTENT, NATIVE = "no_chat", "no_null_content", "native:"


class DeploymentFacts:
    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        # One that serves only Responses: chat clients and summaries go as Responses.
        self.no_chat = MissingRoute(no_chat.ROUTE, no_chat.THEN, size, no_chat.PHRASES)
        self.no_chat.on_learnt = lambda key: self._tell(NO_CHAT, key)
        # A server that answers a null content with an error naming it (llama-cpp-python).
        self.no_null_content: LRUCache[DeploymentKey, bool] = LRUCache(size)
        self._native: dict[str, MissingRoute] = {}  # by wire name
        # Shared (share): the replicas' state store, and native-route facts other replicas
        # published before this one's wire asked for that route.
        self._state: StateStore | None = None
        self._early: dict[str, LRUCache[DeploymentKey, bool]] = {}
        self._publishing: set[asyncio.Task[None]] = set()

    def native_route(self, wire: str, route: str, then: str) -> MissingRoute:
        """The deployments learnt to lack `wire`'s native `route` (an OpenAI-compatible
        server without /v1/responses): that wire's clients then go translated to chat. Named
        by the wire's own modules, the first time they ask."""
        found = self._native.get(wire)
        if found is None:
            found = self._native[wire] = MissingRoute(route, then, self.size)
            found.on_learnt = lambda key: self._tell(NATIVE + wire, key)
            for key in self._early.pop(wire, {}):
                found.know(key)
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

    def learn_no_null_content(self, deployment: Deployment) -> None:
        key = (deployment.model, deployment.api_base)
        self.no_null_content[key] = True
        self._tell(NO_NULL_CONTENT, key)

    # --- shared by replicas ---

    def share(self, state: StateStore) -> None:
        """Publish what is learnt from now on to `state`, which `follow` reads."""
        self._state = state

    async def follow(self, interval_s: float = FOLLOW_INTERVAL_S) -> None:
        """Learn what the other replicas published (runs for the app's life)."""
        while True:
            await asyncio.sleep(interval_s)
            if self._state is None:
                continue
            with contextlib.suppress(StoreError):  # counted by the store; try again later
                self.learn_published(await self._state.published(SPACE))

    def learn_published(self, published: dict[str, float]) -> None:
        for field in published:
            try:
                fact, model, api_base = orjson.loads(field)
                key = (str(model), None if api_base is None else str(api_base))
            except (orjson.JSONDecodeError, TypeError, ValueError):
                continue  # not one of ours
            if fact == NO_CHAT:
                self.no_chat.know(key)
            elif fact == NO_NULL_CONTENT:
                self.no_null_content[key] = True
            elif isinstance(fact, str) and fact.startswith(NATIVE):
                wire = fact[len(NATIVE) :]
                found = self._native.get(wire)
                if found is not None:
                    found.know(key)
                elif wire.isidentifier():  # a wire's name; bounded like every fact
                    self._early.setdefault(wire, LRUCache(self.size))[key] = True

    async def close(self) -> None:
        """The facts still being published: their writes end (bounded by the store's timeout)."""
        if self._publishing:
            await asyncio.gather(*self._publishing, return_exceptions=True)

    def _tell(self, fact: str, key: DeploymentKey) -> None:
        if self._state is None:
            return
        task = asyncio.ensure_future(self._publish(self._state, fact, key))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def _publish(self, state: StateStore, fact: str, key: DeploymentKey) -> None:
        field = orjson.dumps([fact, *key]).decode()
        try:
            await state.publish(SPACE, field, 1.0, FACT_TTL_S)
        except StoreError as exc:
            warn_limited(log, "facts.publish", "fact %s learnt here only: %s", field, exc)


def as_chat_note(wire: str) -> str:
    """The note of a request sent as chat for its deployment lacks its wire's native route."""
    return f"{wire}_as_chat"
