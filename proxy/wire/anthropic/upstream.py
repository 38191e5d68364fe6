"""Anthropic's Messages API, natively: the client's Anthropic body goes out as it came (what the
policies rewrote aside), over the same pooled aiohttp client, caps and timeouts as the fast
path. Only an Anthropic client's requests take it; an OpenAI client's requests to an Anthropic
model go through litellm's translation."""

from __future__ import annotations

from typing import Any

from proxy.policies.spec import Deployment
from proxy.upstream.openai_compat import OpenAICompatUpstream

DEFAULT_BASE = "https://api.anthropic.com"
DEFAULT_VERSION = "2023-06-01"


class AnthropicUpstream(OpenAICompatUpstream):
    reply_kind = "Messages API message"

    @staticmethod
    def is_reply(data: dict[str, Any]) -> bool:
        return data.get("type") == "message" and isinstance(data.get("content"), list)

    def url(self, deployment: Deployment) -> str:
        base = (deployment.api_base or DEFAULT_BASE).rstrip("/")
        return f"{base}/messages" if base.endswith("/v1") else f"{base}/v1/messages"

    def auth_headers(self, deployment: Deployment) -> dict[str, str]:
        return {"x-api-key": deployment.api_key} if deployment.api_key else {}


def speaks_anthropic(deployment: Deployment) -> bool:
    """Whether the deployment takes Anthropic's wire natively."""
    return deployment.provider == "anthropic"
