"""The proxy's own requests (summaries) as Responses: for a deployment that serves only
/v1/responses (OpenAI's codex and pro models, a Codex-style server), and a Responses client's
own deployment."""

from __future__ import annotations

from typing import Any

from proxy.policies.spec import OPENAI_COMPATIBLE_PROVIDERS, Deployment

OPENAI_API = OPENAI_COMPATIBLE_PROVIDERS["openai"]
# A reasoning model's reasoning counts within max_output_tokens: room for it on top at
# OpenAI's own API, where the windows are large (elsewhere the limit may not exceed what the
# window leaves, so the summary's own limit is sent as it is).
REASONING_ALLOWANCE = 4_096


class ResponsesOneShot:
    headers: dict[str, str] = {}

    @staticmethod
    def request(deployment: Deployment, system: str, user: str, max_tokens: int) -> dict[str, Any]:
        if deployment.provider == "openai" and deployment.base_url == OPENAI_API:
            max_tokens += REASONING_ALLOWANCE
        return {
            "model": deployment.alias,
            "instructions": system,
            "input": [{"role": "user", "content": user}],
            "max_output_tokens": max_tokens,
            "stream": False,
            "store": False,  # nothing to continue from: kept nowhere at the provider
        }

    @staticmethod
    def text(data: dict[str, Any]) -> str | None:
        """The output messages' output_text parts, joined (reasoning items skipped)."""
        parts = [
            part.get("text")
            for item in data.get("output") or ()
            if isinstance(item, dict) and item.get("type") == "message"
            for part in item.get("content") or ()
            if isinstance(part, dict) and part.get("type") == "output_text"
        ]
        text = "".join(p for p in parts if isinstance(p, str))
        return text or None


ONE_SHOT = ResponsesOneShot()
