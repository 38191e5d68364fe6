"""Deployments learnt to serve no /v1/responses: an `openai/` model behind an OpenAI-compatible
server that speaks only chat completions (llama.cpp, vLLM builds without it, ...); its Responses
clients then go as chat (missing_routes.py says how it is learnt; the app's DeploymentFacts,
facts.py, remembers it)."""

from __future__ import annotations

from proxy.policies.spec import Deployment

NOTE = "responses_as_chat"
ROUTE = "/v1/responses"
THEN = (
    "its Responses requests now go as chat completions (write its model as hosted_vllm/... to "
    "say so in the config)"
)


def may_serve_responses(deployment: Deployment) -> bool:
    """An `openai/` deployment: OpenAI's own API and its twins serve /v1/responses (others,
    `hosted_vllm/` and the like, are sent chat from the start)."""
    return deployment.provider == "openai" and deployment.base_url is not None
