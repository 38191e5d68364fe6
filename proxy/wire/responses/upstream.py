"""OpenAI's Responses API, natively: the client's Responses body goes out as it came (what the
policies rewrote aside), over the fast path's pooled client, caps and timeouts."""

from __future__ import annotations

from typing import Any

from proxy.exchange import Usage, cached_tokens
from proxy.policies.spec import Deployment
from proxy.upstream.facts import DeploymentFacts
from proxy.upstream.missing_routes import MissingRoute
from proxy.upstream.openai_compat import OpenAICompatUpstream

WIRE = "responses"
ROUTE = "/v1/responses"
LACKING_THEN = (
    "its Responses requests now go as chat completions (write its model as hosted_vllm/... to "
    "say so in the config)"
)


def responses_usage(usage: Any) -> Usage | None:
    """A Responses usage: input_tokens, which include input_tokens_details.cached_tokens."""
    if not isinstance(usage, dict) or "input_tokens" not in usage:
        return Usage.of(usage)  # a chat-shaped one (a translated reply)
    prompt, output = usage.get("input_tokens"), usage.get("output_tokens", 0)
    if not isinstance(prompt, int | None) or not isinstance(output, int):
        return None
    return Usage(prompt or 0, output, cached_tokens(usage.get("input_tokens_details")))


class ResponsesUpstream(OpenAICompatUpstream):
    wire = WIRE
    path = "/responses"
    reply_kind = "Responses API response"

    def __init__(self, settings_source: Any, facts: DeploymentFacts) -> None:
        super().__init__(settings_source)
        self.facts = facts
        no_responses(facts)  # its clients' route, learnt lacking from here on

    def speaks(self, deployment: Deployment) -> bool:
        return speaks_responses(deployment, self.facts)

    @staticmethod
    def usage(data: dict[str, Any]) -> Usage | None:
        return responses_usage(data.get("usage"))

    @staticmethod
    def is_reply(data: dict[str, Any]) -> bool:
        return data.get("object") == "response" and isinstance(data.get("output"), list)


class ResponsesCompactUpstream(ResponsesUpstream):
    """POST /responses/compact, natively: a compaction the provider does itself."""

    wire = "responses_compact"
    path = "/responses/compact"
    reply_kind = "compacted response"

    @staticmethod
    def is_reply(data: dict[str, Any]) -> bool:
        return data.get("object") == "response.compaction" and isinstance(data.get("output"), list)


def speaks_responses(deployment: Deployment, facts: DeploymentFacts) -> bool:
    """Whether the deployment takes the Responses wire natively: OpenAI's own API (and its
    twins), unless it was learnt to serve no /v1/responses (`no_responses`). Other
    OpenAI-compatible servers mostly lack it."""
    return may_serve_responses(deployment) and not no_responses(facts).lacked_by(deployment)


def may_serve_responses(deployment: Deployment) -> bool:
    """An `openai/` deployment: OpenAI's own API and its twins serve /v1/responses (others,
    `hosted_vllm/` and the like, are sent chat from the start)."""
    return deployment.provider == "openai" and deployment.base_url is not None


def no_responses(facts: DeploymentFacts) -> MissingRoute:
    """Deployments learnt to serve no /v1/responses: an `openai/` model behind an
    OpenAI-compatible server that speaks only chat completions (llama.cpp, vLLM builds
    without it, ...); its Responses clients then go as chat (proxy/upstream/missing_routes.py
    says how it is learnt, the rewriter's after_rejection learns it)."""
    return facts.native_route(WIRE, ROUTE, LACKING_THEN)
