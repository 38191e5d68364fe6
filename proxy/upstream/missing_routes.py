"""Routes a deployment was learnt not to serve, from its own 404 on them.

Two are learnt: /v1/responses, behind an `openai/` model whose server speaks only chat completions
(llama.cpp, vLLM builds without it: its Responses clients then go as chat; the Responses wire
names it, wire/responses/upstream.py), and
/v1/chat/completions, behind one that serves only Responses (OpenAI's codex and pro models: its
chat clients' requests and the proxy's own summaries then go as Responses, no_chat.py).

A server without the route answers 404 with a body that is not OpenAI's: `{"detail":"Not
Found"}`, plain text, an error without OpenAI's `type`/`code`; OpenAI's own 404 for an unknown
model (`"code": "model_not_found"`) stays a 404. A route may also name what its error says
when it is missing (OpenAI's "only supported in v1/responses", a 400 or 404). Only the
upstream's own answer on the route teaches it, so no tenant can poison it; it is a fact about
the operator's deployment (its model and address), remembered in process, bounded, and logged
once per deployment.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson
from cachetools import LRUCache

from proxy.policies.spec import Deployment

log = logging.getLogger("agentproxy.upstream")

SCAN_BYTES = 64 * 1024
DeploymentKey = tuple[str, str | None]  # a deployment's model and address


def lacks_route(status: int, body: bytes, phrases: tuple[str, ...] = ()) -> bool:
    """A 404 that says the route is missing, not that an OpenAI model or object is; or a
    400/404 error that says so in one of `phrases` (OpenAI's "This model is only supported in
    v1/responses and not in v1/chat/completions.", for its Responses-only models)."""
    if phrases and status in (400, 404):
        text = body[:SCAN_BYTES].decode("utf-8", "replace")
        if any(phrase in text for phrase in phrases):
            return True
    if status != 404:
        return False
    try:
        data = orjson.loads(body[:SCAN_BYTES])
    except orjson.JSONDecodeError:
        return True  # an HTML or plain-text "Not Found"
    error = data.get("error") if isinstance(data, dict) else None
    return not (isinstance(error, dict) and (error.get("type") or error.get("code")))


class MissingRoute:
    """The deployments learnt not to serve `route`; `then` says what the proxy does instead."""

    def __init__(self, route: str, then: str, size: int, phrases: tuple[str, ...] = ()) -> None:
        self.route = route
        self.then = then
        self.phrases = phrases  # what an error body says when the route is missing
        self._learnt: LRUCache[DeploymentKey, bool] = LRUCache(size)
        # Told of each deployment learnt here (facts.py shares it with the other replicas).
        self.on_learnt: Callable[[DeploymentKey], None] | None = None

    def lacked_by(self, deployment: Deployment) -> bool:
        if not self._learnt:  # the common case: nothing learnt at all
            return False
        return (deployment.model, deployment.api_base) in self._learnt

    def learn(self, deployment: Deployment, status: int, body: bytes) -> bool:
        """After the deployment's own answer on the route: True when it lacks the route
        (learnt now, logged once per deployment)."""
        if self.lacked_by(deployment):
            return True
        if not lacks_route(status, body, self.phrases):
            return False
        key = (deployment.model, deployment.api_base)
        self._learnt[key] = True
        if self.on_learnt is not None:
            self.on_learnt(key)
        log.warning(
            "deployment '%s' (%s at %s) serves no %s: %s",
            deployment.alias,
            deployment.model,
            deployment.api_base,
            self.route,
            self.then,
        )
        return True

    def know(self, key: DeploymentKey) -> None:
        """Another replica learnt it (facts.py): known here too, without a word."""
        if key not in self._learnt:
            self._learnt[key] = True
