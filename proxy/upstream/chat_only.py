"""Deployments learnt to serve no /v1/responses: an `openai/` model behind an OpenAI-compatible
server that speaks only chat completions (llama.cpp, vLLM builds without it, ...).

Such a server answers 404 on the route with a body that is not OpenAI's: `{"detail":"Not
Found"}`, plain text, an error without OpenAI's `type`/`code`. OpenAI's own 404 for an unknown
model (`"code": "model_not_found"`) stays a 404. Only the upstream's own answer on the route
teaches it, so no tenant can poison it; it is a fact about the operator's deployment (its model
and address), remembered in process, bounded, and every later request goes as chat at once.
"""

from __future__ import annotations

import logging

import orjson
from cachetools import LRUCache

from proxy.policies.spec import Deployment

log = logging.getLogger("agentproxy.upstream")

NOTE = "responses_as_chat"
SCAN_BYTES = 64 * 1024
_chat_only: LRUCache[tuple[str, str | None], bool] = LRUCache(4096)


def may_serve_responses(deployment: Deployment) -> bool:
    """An `openai/` deployment: OpenAI's own API and its twins serve /v1/responses (others,
    `hosted_vllm/` and the like, are sent chat from the start)."""
    return deployment.provider == "openai" and deployment.base_url is not None


def is_chat_only(deployment: Deployment) -> bool:
    if not _chat_only:  # the common case: nothing learnt at all
        return False
    return (deployment.model, deployment.api_base) in _chat_only


def lacks_route(status: int, body: bytes) -> bool:
    """A 404 that says the route is missing, not that an OpenAI model or object is."""
    if status != 404:
        return False
    try:
        data = orjson.loads(body[:SCAN_BYTES])
    except orjson.JSONDecodeError:
        return True  # an HTML or plain-text "Not Found"
    error = data.get("error") if isinstance(data, dict) else None
    return not (isinstance(error, dict) and (error.get("type") or error.get("code")))


def learn(deployment: Deployment, status: int, body: bytes) -> bool:
    """After the deployment's own answer to a Responses request: True when it serves no
    /v1/responses (learnt now, logged once per deployment)."""
    if is_chat_only(deployment):
        return True
    if not lacks_route(status, body):
        return False
    _chat_only[(deployment.model, deployment.api_base)] = True
    log.warning(
        "deployment '%s' (%s at %s) serves no /v1/responses: its Responses requests now go "
        "as chat completions (write its model as hosted_vllm/... to say so in the config)",
        deployment.alias,
        deployment.model,
        deployment.api_base,
    )
    return True
