"""OpenAI's Responses API, natively: the client's Responses body goes out as it came (what the
policies rewrote aside), over the fast path's pooled client, caps and timeouts."""

from __future__ import annotations

from typing import Any

from proxy.policies.spec import Deployment
from proxy.upstream.openai_compat import OpenAICompatUpstream


class ResponsesUpstream(OpenAICompatUpstream):
    path = "/responses"
    reply_kind = "Responses API response"

    @staticmethod
    def is_reply(data: dict[str, Any]) -> bool:
        return data.get("object") == "response" and isinstance(data.get("output"), list)


def speaks_responses(deployment: Deployment) -> bool:
    """Whether the deployment takes the Responses wire natively: OpenAI's own API (and its
    twins). Other OpenAI-compatible servers mostly lack it."""
    return deployment.provider == "openai" and deployment.base_url is not None
