"""Gemini surface: POST /v1beta/models/{model}:generateContent, :streamGenerateContent?alt=sse
and :countTokens; GET /v1beta/models and /v1beta/models/{model}; the same under /v1/ (the
google-genai SDK's default), where GET /v1/models is shared with OpenAI's list (a request
carrying Google's key, `x-goog-api-key` or `?key=`, gets Google's: proxy/wire/models.py).

`{model}` is a proxy alias. The stages rewrite the request's chat-shaped view
(proxy/wire/gemini/view.py); a `gemini/` deployment gets the client's body back with only what
they changed, any other deployment the view as a Chat Completions request, its answer
translated back.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.errors import BadRequest, Forbidden, NotFound
from proxy.exchange import ClientRequest, Exchange
from proxy.flow import Flow
from proxy.http.auth import authenticate
from proxy.http.headers import proxy_headers
from proxy.pipeline.compaction.budget import schema_tokens, tokens_of
from proxy.policies.spec import Config
from proxy.sessions.identity import owner_of, session_id
from proxy.state import CONFIG, TURN_MEMORY
from proxy.upstream.base import UpstreamHTTPError
from proxy.wire.chat.degraded import degraded_text
from proxy.wire.gemini import replies as gemini
from proxy.wire.gemini.memory import GeminiMemory
from proxy.wire.gemini.request import field, parse_generate_request
from proxy.wire.gemini.stream import Relay, response_stream
from proxy.wire.gemini.view import GeminiView
from proxy.wire.serve import (
    events_answer,
    json_answer,
    open_exchange,
    read_request,
    relay_stream,
    serve,
    upstream_error,
)

routes = web.RouteTableDef()
VERSIONS = ("/v1beta", "/v1")
GENERATE_ROUTE = "/v1beta/models/{model}:generateContent"  # the `route` label of its metrics
ACTIONS = ("generateContent", "streamGenerateContent", "countTokens")
METHODS = ["generateContent", "streamGenerateContent", "countTokens"]
STORED_FILES = ("files/", "https://generativelanguage.googleapis.com/")


KEY_HEADER, KEY_QUERY = "x-goog-api-key", "key"  # where Google's clients send their key


def wants_gemini(request: web.Request) -> bool:
    """A request in Google's manner (its key header or query): GET /v1/models answers it
    with Google's list."""
    return KEY_HEADER in request.headers or KEY_QUERY in request.query


async def model_action(request: web.Request) -> web.StreamResponse:
    alias, _, action = request.match_info["target"].rpartition(":")
    if action not in ACTIONS or not alias:
        raise NotFound(
            f"{request.path} is not served: models/{{model}}: takes one of {', '.join(ACTIONS)}"
        )
    alias = alias.removeprefix("models/")
    if action == "countTokens":
        return await _count_tokens(request, alias)
    stream = action == "streamGenerateContent"
    if stream and request.query.get("alt") != "sse":
        raise BadRequest("streamGenerateContent is served as server-sent events: add ?alt=sse")
    ex = await _exchange(request, alias, stream=stream)
    return await serve(request, ex, GeminiAnswers(ex))


def model_list(config: Config, aliases: list[str]) -> dict[str, Any]:
    """GET /v1beta/models (and /v1/models in Google's manner) in Google's shape
    (proxy/wire/models.py serves it)."""
    return {"models": [_model(config, alias) for alias in aliases]}


async def get_model(request: web.Request) -> web.Response:
    config = request.app[CONFIG].current
    key = authenticate(request, config.keys)
    alias = request.match_info["target"].removeprefix("models/")
    if alias not in config.deployments:
        raise NotFound(f"models/{alias} is not found: GET {VERSIONS[0]}/models lists them")
    if key is not None and key.models is not None and alias not in key.models:
        raise Forbidden(f"API key '{key.name}' may not use model '{alias}'")
    return web.json_response(_model(config, alias), dumps=_dumps)


for version in VERSIONS:
    routes.post(f"{version}/models/{{target:.+}}")(model_action)
    routes.get(f"{version}/models/{{target:.+}}")(get_model)
LIST_PATHS = tuple(f"{version}/models" for version in VERSIONS)  # /v1/ shared with OpenAI's


def _model(config: Config, alias: str) -> dict[str, Any]:
    deployment = config.deployments[alias][0]
    model: dict[str, Any] = {
        "name": f"models/{alias}",
        "version": "agentproxy",
        "displayName": alias,
        "supportedGenerationMethods": METHODS,
    }
    if deployment.max_input_tokens:
        model["inputTokenLimit"] = deployment.max_input_tokens
    if deployment.max_output_tokens:
        model["outputTokenLimit"] = deployment.max_output_tokens
    return model


async def _count_tokens(request: web.Request, alias: str) -> web.Response:
    """The proxy's estimate of the prompt as the client sent it: enough for a client's own
    context bookkeeping."""
    ex = await _exchange(request, alias, counting=True)
    tokens = tokens_of(ex.body["messages"]) + schema_tokens(ex.body.get("tools"))
    return web.json_response({"totalTokens": tokens}, headers=proxy_headers(ex))


async def _exchange(
    request: web.Request, alias: str, *, stream: bool = False, counting: bool = False
) -> Exchange:
    config, key, raw = await read_request(request)
    body = parse_generate_request(raw, alias, counting=counting)
    opening = lambda: GeminiView.opening(body)  # noqa: E731 - only if no session id came
    session = session_id(request.headers, {}, key.name if key else None, opening)
    owner, memory = owner_of(key, config.keys), request.app[TURN_MEMORY]
    view = GeminiView.of(body, memory.recall(owner, session.name, GeminiMemory))
    if key is not None:  # tenants share the provider's account: its stored objects too
        _refuse_stored(body, view.fresh)
    ex = open_exchange(
        request,
        config,
        key,
        view.chat_body(),
        session,
        ClientRequest(
            route=GENERATE_ROUTE,
            wire="gemini",
            renderer=view,
            native=view,
            stream=stream,
            wants_usage=True,
            body_bytes=len(raw),
        ),
    )
    if not counting:
        memory.keep(owner, session.name, view.memory(), len(raw))
    return ex


def _refuse_stored(body: dict[str, Any], fresh: int) -> None:
    """A cached content or an uploaded file lives in the provider's account, which every key
    of this proxy shares: naming one would read what another tenant stored. Contents before
    `fresh` were lent by the session's last view, whose turn checked them."""
    if field(body, "cachedContent") is not None:
        raise BadRequest(
            "cached_content names content stored at the provider, which this proxy's keys "
            "share: send the content itself",
            param="cached_content",
            code="stored_object_refused",
        )
    contents = body["contents"]
    for i in range(fresh, len(contents)):
        for k, part in enumerate(contents[i]["parts"]):
            uri = field(field(part, "fileData"), "fileUri")
            if isinstance(uri, str) and uri.startswith(STORED_FILES):
                raise BadRequest(
                    f"contents[{i}].parts[{k}].file_data names a file stored at the provider, "
                    "which this proxy's keys share: send it as inline_data",
                    param=f"contents[{i}].parts[{k}].file_data",
                    code="stored_object_refused",
                )


class GeminiAnswers:
    """Gemini answers: a response, its chunk stream, errors in Google's shape."""

    def __init__(self, ex: Exchange) -> None:
        view = ex.client.native
        assert isinstance(view, GeminiView)
        self.view = view
        self.replies = gemini.Replies(view)

    async def complete(self, ex: Exchange, flow: Flow) -> web.Response:
        reply = await flow.complete(ex, self.replies)
        if "choices" not in reply.data:  # the provider's own response, as it came
            return json_answer(ex, reply.body, reply.headers)
        response = gemini.response_from_chat(reply.data, ex.alias, ex.identity.request_id)
        return json_answer(ex, orjson.dumps(response), reply.headers)

    async def stream(self, request: web.Request, ex: Exchange, flow: Flow) -> web.StreamResponse:
        if ex.translated:  # the chat reply is asked for whole, then sent as this wire's chunks
            reply = await flow.complete(ex, self.replies)
            response = gemini.client_response(reply, ex.alias, ex.identity.request_id)
            return events_answer(ex, response_stream(response), reply.headers)
        return await relay_stream(
            request, ex, flow, lambda response: Relay(request, ex, response, self.view)
        )

    def upstream_error(self, ex: Exchange, error: UpstreamHTTPError) -> web.Response:
        return upstream_error(ex, error, gemini.passthrough_body(error, ex.identity.request_id))

    def degraded(self, ex: Exchange, error: Exception) -> web.Response:
        text = degraded_text(ex, error)
        response = gemini.degraded_response(ex.alias, ex.identity.request_id, text)
        headers = {"x-agentproxy-degraded": "true"}
        if ex.client.stream:
            return events_answer(ex, response_stream(response), headers)
        return json_answer(ex, orjson.dumps(response), headers)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()
