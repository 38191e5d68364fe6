"""Deployments learnt to serve no /v1/chat/completions: an `openai/` model behind a server that
serves only /v1/responses (OpenAI's codex and pro models; a Codex-style server). The proxy's own
requests (summaries) to it then go as Responses (missing_routes.py says how it is learnt)."""

from __future__ import annotations

from proxy.upstream.missing_routes import MissingRoute

_CHAT = MissingRoute(
    "/v1/chat/completions",
    "the proxy's own requests to it (summaries) now go in another wire it speaks",
)
serves_no_chat = _CHAT.lacked_by
learn_no_chat = _CHAT.learn
