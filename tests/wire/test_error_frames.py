"""A proxy error is framed by the wire whose route the request matched; a path no route
matched (a 404, a request head that never completed) by the wire whose route it extends; else
OpenAI's envelope. A format's routes may then share a prefix with another's (Gemini's
/v1/models/{model}:generateContent beside chat's /v1/models)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from proxy.errors import BadRequest, ProxyError
from proxy.wire.base import ErrorFrames, WireFormat
from proxy.wire.chat.answer import ChatAnswer
from proxy.wire.chat.conversation import ChatConversation
from proxy.wire.registry import WIRES


def _own_envelope(error: ProxyError, request_id: str | None) -> Mapping[str, Any]:
    return {"own": error.message}


def _wire() -> WireFormat:
    routes = web.RouteTableDef()

    @routes.post("/v1/models/{model:[^/]+}:act")
    async def act(request: web.Request) -> web.Response:
        raise NotImplementedError

    return WireFormat(
        name="own",
        routes=routes,
        model_route=None,
        provider="own",
        assembly=ChatAnswer,
        conversation=ChatConversation(),
        error_shape=_own_envelope,
    )


ERROR = BadRequest("no")


def test_the_matched_route_s_wire_frames_the_error() -> None:
    frames = ErrorFrames((*WIRES, _wire()))
    assert frames("/v1/models/{model}:act", "/v1/models/m:act", ERROR, None) == {"own": "no"}
    assert "error" in frames("/v1/models", "/v1/models", ERROR, None)  # chat's: OpenAI's
    assert frames("/v1/messages", "/v1/messages", ERROR, None)["type"] == "error"  # Anthropic's


def test_an_unmatched_path_is_framed_by_the_wire_whose_route_it_extends() -> None:
    frames = ErrorFrames(WIRES)
    assert frames(None, "/v1/messages/nothing", ERROR, None)["type"] == "error"
    assert "error" in frames(None, "/v1/nothing", ERROR, None)
    assert "error" in frames("/admin/sessions", "/admin/sessions", ERROR, None)  # no wire's
