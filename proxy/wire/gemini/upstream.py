"""Google AI Studio's Gemini REST API, natively: the client's Gemini body goes out as it came
(what the policies rewrote aside), over the same pooled client, caps and timeouts as the fast
path. The model is named in the URL (`models/{model}:generateContent`), the key in
`x-goog-api-key`."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.exchange import Usage
from proxy.policies.spec import Deployment
from proxy.upstream.facts import DeploymentFacts
from proxy.upstream.openai_compat import OpenAICompatUpstream

DEFAULT_BASE = "https://generativelanguage.googleapis.com"
DEFAULT_VERSION = "v1beta"  # where every feature the clients use is served


def gemini_usage(usage: Any) -> Usage | None:
    """A `usageMetadata`: the prompt (promptTokenCount, cachedContentTokenCount of it read from
    the cache) and the output (candidatesTokenCount plus thoughtsTokenCount, billed alike)."""
    if not isinstance(usage, dict) or "promptTokenCount" not in usage:
        return Usage.of(usage)  # a chat-shaped one (a translated reply)
    counts = [
        usage.get(name)
        for name in (
            "promptTokenCount",
            "candidatesTokenCount",
            "thoughtsTokenCount",
            "cachedContentTokenCount",
            "toolUsePromptTokenCount",
        )
    ]
    if not all(isinstance(c, int) or c is None for c in counts):
        return None
    prompt, output, thoughts, cached, tool_prompt = (c or 0 for c in counts)
    return Usage(prompt + tool_prompt, output + thoughts, cached)


def base_of(deployment: Deployment) -> str:
    """The API's versioned root: api_base as given when it names a version, else with v1beta."""
    base = (deployment.api_base or DEFAULT_BASE).rstrip("/")
    last = base.rsplit("/", 1)[-1]
    return base if last.startswith("v1") else f"{base}/{DEFAULT_VERSION}"


class GeminiUpstream(OpenAICompatUpstream):
    wire = "gemini"
    reply_kind = "Gemini GenerateContentResponse"

    def __init__(self, settings_source: Any, facts: DeploymentFacts) -> None:
        super().__init__(settings_source)  # it learns nothing of its deployments

    @staticmethod
    def speaks(deployment: Deployment) -> bool:
        return speaks_gemini(deployment)

    @staticmethod
    def usage(data: dict[str, Any]) -> Usage | None:
        return gemini_usage(data.get("usageMetadata"))

    @staticmethod
    def is_reply(data: dict[str, Any]) -> bool:
        # A prompt the safety filters blocked comes back without candidates.
        return isinstance(data.get("candidates"), list) or "promptFeedback" in data

    def url(self, deployment: Deployment) -> str:
        return f"{base_of(deployment)}/models/{deployment.upstream_model}:generateContent"

    def posting(
        self, deployment: Deployment, body: dict[str, Any], stream: bool
    ) -> tuple[str, bytes]:
        url = self.url(deployment)
        if stream:
            url = url.replace(":generateContent", ":streamGenerateContent?alt=sse")
        return url, orjson.dumps(body)

    def auth_headers(self, deployment: Deployment) -> dict[str, str]:
        return {"x-goog-api-key": deployment.api_key} if deployment.api_key else {}


def speaks_gemini(deployment: Deployment) -> bool:
    """Whether the deployment takes Gemini's wire natively (Google AI Studio's API)."""
    return deployment.provider == "gemini"
