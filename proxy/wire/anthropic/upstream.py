"""Anthropic's Messages API, natively: the client's Anthropic body goes out as it came (what the
policies rewrote aside), over the same pooled aiohttp client, caps and timeouts as the fast
path. Only an Anthropic client's requests take it; an OpenAI client's requests to an Anthropic
model go through litellm's translation."""

from __future__ import annotations

from typing import Any

from proxy.exchange import Usage
from proxy.policies.spec import Deployment
from proxy.upstream.facts import DeploymentFacts
from proxy.upstream.openai_compat import OpenAICompatUpstream

DEFAULT_BASE = "https://api.anthropic.com"
DEFAULT_VERSION = "2023-06-01"


CACHE_FIELDS = ("cache_read_input_tokens", "cache_creation_input_tokens")


def anthropic_usage(usage: Any) -> Usage | None:
    """An Anthropic usage: input_tokens beside cache_read_input_tokens and
    cache_creation_input_tokens (the prompt is their sum)."""
    if not isinstance(usage, dict) or "input_tokens" not in usage:
        return Usage.of(usage)  # a chat-shaped one (a translated reply)
    counts = [usage.get(name) for name in ("input_tokens", *CACHE_FIELDS)]
    output = usage.get("output_tokens", 0)
    if not all(isinstance(c, int) or c is None for c in counts) or not isinstance(output, int):
        return None
    uncached, read, written = (c or 0 for c in counts)
    return Usage(uncached + read + written, output, read, written)


class AnthropicUpstream(OpenAICompatUpstream):
    wire = "anthropic"
    reply_kind = "Messages API message"

    def __init__(self, settings_source: Any, facts: DeploymentFacts) -> None:
        super().__init__(settings_source)  # it learns nothing of its deployments

    @staticmethod
    def speaks(deployment: Deployment) -> bool:
        return speaks_anthropic(deployment)

    @staticmethod
    def usage(data: dict[str, Any]) -> Usage | None:
        return anthropic_usage(data.get("usage"))

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
