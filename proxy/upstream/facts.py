"""What the proxy learnt about the operator's deployments from their own answers: the routes a
deployment lacks (missing_routes.py: /v1/responses, chat_only.py; /v1/chat/completions,
no_chat.py) and whether it refuses a null content (proxy/pipeline/compat.py). One object per
app (its FACTS key), made in the app's setup and handed to what reads or teaches it: two apps
in one process learn apart. Facts about a deployment (its model and address, so a config
reload keeps them), not about anyone's data: every tenant's requests to it see them alike."""

from __future__ import annotations

from cachetools import LRUCache

from proxy.upstream import chat_only, no_chat
from proxy.upstream.missing_routes import MissingRoute

SIZE = 4096  # deployments remembered per fact (those of configs long replaced fall out)


class DeploymentFacts:
    def __init__(self, size: int = SIZE) -> None:
        # An `openai/` server that speaks only chat completions: Responses clients go as chat.
        self.no_responses = MissingRoute(chat_only.ROUTE, chat_only.THEN, size)
        # One that serves only Responses: chat clients and summaries go as Responses.
        self.no_chat = MissingRoute(no_chat.ROUTE, no_chat.THEN, size, no_chat.PHRASES)
        # A server that answers a null content with an error naming it (llama-cpp-python).
        self.no_null_content: LRUCache[tuple[str, str | None], bool] = LRUCache(size)
