"""The proxy's own requests (summaries) as Anthropic Messages: to an `anthropic/` deployment
natively, without litellm's translation (nor its import)."""

from __future__ import annotations

from typing import Any

from proxy.policies.spec import Deployment
from proxy.wire.anthropic.upstream import DEFAULT_VERSION


class AnthropicOneShot:
    headers: dict[str, str] = {"anthropic-version": DEFAULT_VERSION}

    @staticmethod
    def request(deployment: Deployment, system: str, user: str, max_tokens: int) -> dict[str, Any]:
        return {
            "model": deployment.alias,
            "system": system,
            "messages": [{"role": "user", "content": user}],
            "max_tokens": max_tokens,
            "stream": False,
        }

    @staticmethod
    def text(data: dict[str, Any]) -> str | None:
        """The text blocks, joined (thinking blocks skipped)."""
        texts = [
            block.get("text")
            for block in data.get("content") or ()
            if isinstance(block, dict) and block.get("type") == "text"
        ]
        text = "".join(t for t in texts if isinstance(t, str))
        return text or None


ONE_SHOT = AnthropicOneShot()
