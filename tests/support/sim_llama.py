"""The simulator with llama-cpp-python's server quirks (0.3.36, seen against the real one):

- an `X-Request-Id` that is not a UUID gets a 400 with an empty body (starlette-context's
  RequestIdPlugin validates it before anything else runs);
- an assistant message with `content: null` (what the openai SDK sends back after a tool
  call) gets a 500 whose body is pydantic's validation error, every time: its request model
  types that content as a plain string.

    sim = LlamaCppSimulator()  # a Simulator: its requests are recorded, refused ones too
"""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from proxy.sim.model import JSON
from proxy.sim.simulator import Simulator, _Call

# The validation line llama-cpp-python's 500 carries for a null assistant content (its body
# lists one error per message type of the union; this is the one that matters).
NULL_CONTENT_LINE = (
    "{{'type': 'string_type', 'loc': ('body', 'messages', {index}, "
    "'ChatCompletionRequestAssistantMessage', 'content'), 'msg': 'Input should be a valid "
    "string', 'input': None}}"
)
TRACE = (
    '  File "/venv/lib/python3.11/site-packages/llama_cpp/server/app.py", line 376, in '
    "create_chat_completion\n    POST /v1/chat/completions"
)


class LlamaCppSimulator(Simulator):
    """The Simulator, refusing what llama-cpp-python's server refuses (before its own checks)."""

    async def _answer(
        self, call: _Call, body: JSON | None, seq: int, id_prefix: str
    ) -> web.StreamResponse:
        given = call.request.headers.get("X-Request-Id")
        if given is not None and not is_valid_request_id(given):
            return web.Response(status=400, body=b"", headers={"vary": "Origin"})
        chat = body is not None and call.request.path.endswith("/chat/completions")
        if chat and body is not None and (nulls := null_content_indexes(body)):
            return web.json_response(validation_error(nulls), status=500)
        return await super()._answer(call, body, seq, id_prefix)


def is_valid_request_id(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def null_content_indexes(body: JSON) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [
        index
        for index, message in enumerate(messages)
        if isinstance(message, dict)
        and message.get("role") == "assistant"
        and "content" in message
        and message["content"] is None
    ]


def validation_error(indexes: list[int]) -> dict[str, Any]:
    lines = "\n".join(f"  {NULL_CONTENT_LINE.format(index=i)}" for i in indexes)
    errors = "validation error" if len(indexes) == 1 else "validation errors"
    message = f"{len(indexes)} {errors}:\n{lines}\n\n{TRACE}"
    return {
        "error": {"message": message, "type": "internal_server_error", "param": None, "code": None}
    }
