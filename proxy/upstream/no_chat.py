"""Deployments learnt to serve no /v1/chat/completions: an `openai/` model behind a server that
serves only /v1/responses (OpenAI's codex and pro models; a Codex-style server). Chat clients'
requests to it then go as Responses (proxy/wire/chat_as_responses.py), and so do the proxy's own
(summaries). Learnt from a 404 that is not OpenAI's (missing_routes.py), or from OpenAI's own
error for such a model on chat: "This model is only supported in v1/responses and not in
v1/chat/completions."; the app's DeploymentFacts (facts.py) remembers it."""

from __future__ import annotations

NOTE = "chat_as_responses"
ROUTE = "/v1/chat/completions"
THEN = "its chat clients' requests and the proxy's own (summaries) now go as Responses"
PHRASES = ("only supported in v1/responses",)
