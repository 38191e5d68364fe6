"""Deployments learnt to serve no /v1/chat/completions: an `openai/` model behind a server that
serves only /v1/responses (OpenAI's codex and pro models; a Codex-style server). The proxy's own
requests (summaries) to it then go as Responses.

The mirror of chat_only.py: only the upstream's own 404 on the route teaches it (a body that is
not OpenAI's error, so an unknown model stays a 404), so no tenant can poison it; a fact about
the operator's deployment (its model and address), remembered in process, bounded, logged once.
"""

from __future__ import annotations

import logging

from cachetools import LRUCache

from proxy.policies.spec import Deployment
from proxy.upstream.chat_only import lacks_route

log = logging.getLogger("agentproxy.upstream")

_no_chat: LRUCache[tuple[str, str | None], bool] = LRUCache(4096)


def serves_no_chat(deployment: Deployment) -> bool:
    if not _no_chat:  # the common case: nothing learnt at all
        return False
    return (deployment.model, deployment.api_base) in _no_chat


def learn_no_chat(deployment: Deployment, status: int, body: bytes) -> bool:
    """After the deployment's own answer to a chat request: True when it serves no chat
    completions (learnt now, logged once per deployment)."""
    if serves_no_chat(deployment):
        return True
    if not lacks_route(status, body):
        return False
    _no_chat[(deployment.model, deployment.api_base)] = True
    log.warning(
        "deployment '%s' (%s at %s) serves no /v1/chat/completions: the proxy's own requests "
        "to it (summaries) now go in another wire it speaks",
        deployment.alias,
        deployment.model,
        deployment.api_base,
    )
    return True
