"""Deployments learnt to serve no /v1/responses: an `openai/` model behind an OpenAI-compatible
server that speaks only chat completions (llama.cpp, vLLM builds without it, ...); its Responses
clients then go as chat (missing_routes.py says how it is learnt)."""

from __future__ import annotations

from proxy.policies.spec import Deployment
from proxy.upstream.missing_routes import MissingRoute

__all__ = ["NOTE", "is_chat_only", "learn", "may_serve_responses"]

NOTE = "responses_as_chat"
_RESPONSES = MissingRoute(
    "/v1/responses",
    "its Responses requests now go as chat completions (write its model as hosted_vllm/... to "
    "say so in the config)",
)
is_chat_only = _RESPONSES.lacked_by
learn = _RESPONSES.learn


def may_serve_responses(deployment: Deployment) -> bool:
    """An `openai/` deployment: OpenAI's own API and its twins serve /v1/responses (others,
    `hosted_vllm/` and the like, are sent chat from the start)."""
    return deployment.provider == "openai" and deployment.base_url is not None
