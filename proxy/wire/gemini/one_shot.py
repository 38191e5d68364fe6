"""The proxy's own requests (summaries) as Gemini generateContent: to a `gemini/` deployment
natively, without litellm's translation (nor its import)."""

from __future__ import annotations

from typing import Any

from proxy.policies.spec import Deployment
from proxy.wire.gemini.replies import first_parts


class GeminiOneShot:
    headers: dict[str, str] = {}

    @staticmethod
    def request(deployment: Deployment, system: str, user: str, max_tokens: int) -> dict[str, Any]:
        return {
            "systemInstruction": {"parts": [{"text": system}]},
            "contents": [{"role": "user", "parts": [{"text": user}]}],
            "generationConfig": {"maxOutputTokens": max_tokens},
        }

    @staticmethod
    def text(data: dict[str, Any]) -> str | None:
        """The text parts, joined (thoughts skipped)."""
        texts = [
            p["text"]
            for p in first_parts(data)
            if isinstance(p.get("text"), str) and p.get("thought") is not True
        ]
        return "".join(texts) or None


ONE_SHOT = GeminiOneShot()
