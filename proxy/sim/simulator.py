"""A scripted, deterministic model server speaking OpenAI Chat Completions, OpenAI Responses
and Anthropic Messages.

Tests, benchmarks and the demo point the proxy at it instead of a real provider. It checks
requests the way the real APIs do (same statuses and error texts), answers from a script, and
misbehaves on demand through queued Faults, locally (`inject`) or over HTTP (`/sim/faults`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy.runtime.listen import start_site

from .anthropic import AnthropicDialect, betas
from .anthropic import to_chat as anthropic_to_chat
from .chat import OPENAI, OpenAIDialect
from .gemini import GeminiDialect
from .gemini import to_chat as gemini_to_chat
from .model import (
    CHARS_4,
    JSON,
    Reply,
    Tokenizer,
    completion_tokens,
    estimate_prompt_tokens,
    limit_reply,
    reply_from_message,
    scripted_reply,
)
from .responses import ResponsesDialect
from .responses import to_chat as responses_to_chat
from .wire import ApiError, Dialect, Event, Meta

Responder = Callable[[JSON], JSON | Awaitable[JSON]]
# A native answer given as it is, after every check (`agentproxy replay`: what a recording
# answered): called with the route's path and the body; None answers as scripted.
Canned = Callable[[str, JSON], JSON | None]

MODELS_CREATED = 1_700_000_000  # fixed, so /v1/models is byte-stable
_MAX_BODY_BYTES = 256 * 1024 * 1024  # big-context tests must reach the context check, not a 413
_CLOSING = web.AppKey("sim_closing", asyncio.Event)
# What each model route reads a body as: the chat request its dialect answers.
GEMINI_ACTIONS = (":generateContent", ":streamGenerateContent")
_TO_CHAT: dict[str, Callable[[JSON], JSON]] = {
    "/v1/chat/completions": lambda body: body,
    "/v1/messages": anthropic_to_chat,
    "/v1/responses": responses_to_chat,
}


def same_api(path: str, other: str) -> bool:
    """Whether one dialect answers both model routes (a Gemini route names its model)."""
    return _api_of(path) is not None and _api_of(path) == _api_of(other)


def _api_of(path: str) -> str | None:
    if path in _TO_CHAT:
        return path
    return GEMINI_ACTIONS[0] if path.endswith(GEMINI_ACTIONS) else None


def as_chat(path: str, body: JSON) -> JSON:
    """A body the simulator received at `path` as a chat request (tools and messages): what
    `agentproxy replay` measures what went upstream by."""
    if path not in _TO_CHAT and path.endswith(GEMINI_ACTIONS):  # the model is in the path
        return gemini_to_chat(body)
    return _TO_CHAT[path](body)


@dataclass
class Fault:
    """One scripted misbehaviour, consumed by the next matching request(s)."""

    status: int | None = None  # answer this HTTP status with the API's error body (or `body`)
    body: Any = None  # JSON-able or str body replacing the error body (used with `status`)
    retry_after: float | None = None  # Retry-After header, seconds
    retry_after_ms: int | None = None  # retry-after-ms header
    delay_s: float = 0.0  # sleep before answering (to trigger client timeouts)
    reset: bool = False  # close the TCP connection (RST) without any response
    malformed: bool = False  # 200 with a garbled body / a garbage SSE event
    cut_after_chunks: int | None = None  # stream: N content chunks, then drop the connection
    times: int = 1  # how many requests this fault applies to
    model: str | None = None  # only requests for this model name


class Headers(dict[str, str]):
    """A dict with lower-cased names whose lookups ignore case, as HTTP header names do."""

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__((name.lower(), value) for name, value in items)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name.lower() if isinstance(name, str) else name)

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)


@dataclass
class RecordedRequest:
    body: dict[str, Any]  # {} when the body was not a JSON object
    headers: dict[str, str]  # a Headers: lower-cased names, case-insensitive lookups
    path: str
    at: float  # time.monotonic() on arrival
    query: str = ""  # the raw query string, e.g. "beta=true" from Claude Code
    status: int | None = None  # the answer's HTTP status; None while pending or when dropped
    error: str | None = None  # an error answer's message, as the API put it

    @property
    def betas(self) -> list[str]:
        """The betas its `anthropic-beta` header listed."""
        return betas(self.headers)

    @property
    def api_key(self) -> str | None:
        """The key it carried: `x-api-key`, else an `Authorization: Bearer` token."""
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        bearer = token.strip() if scheme.lower() == "bearer" else None
        return self.headers.get("x-api-key") or bearer or None


class Simulator:
    def __init__(
        self,
        *,
        context_window: int = 8192,
        api_key: str | None = None,
        chunk_delay_s: float = 0.0,
        words_per_chunk: int = 1,
        responder: Responder | None = None,
        record: bool = True,
        cache_min_tokens: int = 1024,
        tokenizer: Tokenizer = CHARS_4,
        canned: Canned | None = None,
    ) -> None:
        self.canned = canned
        self.context_window = context_window
        self.api_key = api_key
        self.chunk_delay_s = chunk_delay_s
        self.words_per_chunk = words_per_chunk
        self.responder = responder
        self.record = record  # False keeps long benchmarks from holding every body in memory
        self.request_count = 0  # model requests received, recorded or not
        self.requests: list[RecordedRequest] = []
        self.faults: list[Fault] = []
        self.models_seen: dict[str, None] = {}  # an ordered set
        # How the model counts tokens (usage, the window, cached prefixes): four characters
        # a token unless a test gives a tokenizer of its own.
        self.tokenizer = tokenizer
        # Each twin's prompt cache (prefixes shorter than cache_min_tokens are not cached, as
        # at the APIs); the Anthropic twin's thinking-signature secret; the secret the
        # Responses twin's encrypted reasoning is sealed with.
        self.openai = OpenAIDialect(cache_min_tokens=cache_min_tokens, tokenizer=tokenizer)
        self.anthropic = AnthropicDialect(cache_min_tokens=cache_min_tokens, tokenizer=tokenizer)
        self.responses = ResponsesDialect(cache_min_tokens=cache_min_tokens, tokenizer=tokenizer)
        self.gemini = GeminiDialect(cache_min_tokens=cache_min_tokens, tokenizer=tokenizer)

    def inject(self, *faults: Fault) -> None:
        # Copies: consuming a fault decrements `times`, which must not touch the caller's object.
        self.faults.extend(dataclasses.replace(f) for f in faults)

    def vouch(self, path: str, body: dict[str, Any]) -> None:
        """Take the signed items of a request recorded at `path` (a real client's, answered by
        another API) as this simulator's own: a replay checks they reach it unchanged."""
        dialects: dict[str, Dialect] = {
            "/v1/messages": self.anthropic,
            "/v1/responses": self.responses,
        }
        if (dialect := dialects.get(path)) is not None:
            dialect.vouch(body)

    def reset(self) -> None:
        """Forget requests, pending faults and the prompt cache; ids count from 1 again.
        Thinking signatures minted before stay valid (clients still hold them)."""
        self.requests.clear()
        self.faults.clear()
        self.request_count = 0
        self.openai.prompt_cache.clear()
        self.anthropic.prompt_cache.clear()
        self.responses.prompt_cache.clear()
        self.gemini.prompt_cache.clear()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=_MAX_BODY_BYTES)
        app[_CLOSING] = asyncio.Event()
        app.on_shutdown.append(_wake_sleepers)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/responses/compact", self._responses_compact)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/v1/models", self._models)
        for version in ("/v1beta", "/v1"):  # Gemini: the model and action in the path
            app.router.add_post(version + "/models/{target:.+}", self._gemini)
        app.router.add_post("/sim/faults", self._post_faults)
        app.router.add_get("/sim/requests", self._get_requests)
        app.router.add_delete("/sim/requests", self._delete_requests)
        return app

    # --- model endpoints -------------------------------------------------------------------

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._exchange(request, self.openai, "chatcmpl-sim")

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._exchange(request, self.anthropic, "msg_sim")

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._exchange(request, self.responses, "resp_sim")

    async def _responses_compact(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/responses/compact as OpenAI answers it: the input's user messages, then
        one compaction item whose content is opaque (and, here, made of the input's hash)."""
        body = _json_object(await request.read())
        seq, record = self._record(request, body)
        call = _Call(request, self.responses, f"req_sim{seq:08d}", time.monotonic())
        error = self._auth_error(request, self.responses)
        if body is None or error:
            response = call.error(error or self.responses.invalid_json())
        else:
            response = web.json_response(compacted_window(body, seq))
        if record is not None:
            record.status, record.error = response.status, call.message
        return response

    async def _count_tokens(self, request: web.Request) -> web.StreamResponse:
        return await self._exchange(request, self.anthropic, "", count_tokens=True)

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        """models/{model}:generateContent, :streamGenerateContent, :countTokens."""
        model, _, action = request.match_info["target"].rpartition(":")
        path: JSON = {"model": model.removeprefix("models/")}
        if action == "countTokens":
            body = _json_object(await request.read()) or {}
            seq, _ = self._record(request, body)
            call = _Call(request, self.gemini, f"req_sim{seq:08d}", time.monotonic())
            if error := self._auth_error(request, self.gemini):
                return call.error(error)
            tokens = self.gemini.count_prompt_tokens({**body, **path})
            return call.respond(200, orjson.dumps({"totalTokens": tokens}), "application/json")
        if action not in ("generateContent", "streamGenerateContent"):
            raise web.HTTPNotFound()
        path["stream"] = action == "streamGenerateContent"
        return await self._exchange(request, self.gemini, "gemini-sim", from_path=path)

    async def _exchange(
        self,
        request: web.Request,
        dialect: Dialect,
        id_prefix: str,
        count_tokens: bool = False,
        from_path: JSON | None = None,
    ) -> web.StreamResponse:
        """Record the request, answer it, and note on the record how it was answered.
        `from_path`: what the URL says of the request (Gemini: its model, whether to stream)."""
        started = time.monotonic()
        body = _json_object(await request.read())
        seq, record = self._record(request, body)
        if body is not None and from_path:
            body = {**body, **from_path}
        call = _Call(request, dialect, f"req_sim{seq:08d}", started)
        response: web.StreamResponse
        if count_tokens:
            response = self._count(call, body)
        else:
            response = await self._answer(call, body, seq, id_prefix)
        if record is not None:
            record.status = None if call.dropped else response.status
            record.error = call.message
        return response

    def _count(self, call: _Call, body: JSON | None) -> web.Response:
        """/v1/messages/count_tokens: the same checks, then the prompt's token count."""
        error = self._auth_error(call.request, self.anthropic)
        if body is None:
            return call.error(error or self.anthropic.invalid_json())
        if error := error or self.anthropic.check_count_tokens(body, call.request.headers):
            return call.error(error)
        tokens = {"input_tokens": self.anthropic.count_prompt_tokens(body)}
        return call.respond(200, orjson.dumps(tokens), "application/json")

    async def _answer(
        self, call: _Call, body: JSON | None, seq: int, id_prefix: str
    ) -> web.StreamResponse:
        """Checks in the real API's order, then faults, then the scripted answer."""
        request, dialect = call.request, call.dialect
        error = self._auth_error(request, dialect)
        if body is None:
            return call.error(error or dialect.invalid_json())
        if error := error or dialect.check_body(body, request.headers):
            return call.error(error)
        chat = dialect.to_chat(body)
        prompt_tokens = estimate_prompt_tokens(chat, self.tokenizer)
        model = str(body.get("model", ""))
        if error := dialect.check_context(body, prompt_tokens, self.context_window):
            meta = Meta(f"{id_prefix}{seq:08d}", int(time.time()), model, prompt_tokens, 0)
            if (failure := dialect.stream_failure(body, error, meta)) is not None:
                return await self._stream(call, failure, meta, None)
            return call.error(error)
        fault = self._take_fault(model)
        if fault and (faulted := await self._fault_answer(call, fault, model)):
            return faulted
        if self.canned is not None and (answer := self.canned(request.path, body)) is not None:
            return call.respond(200, orjson.dumps(answer), "application/json")
        reply = await self._reply(chat)
        meta = Meta(
            f"{id_prefix}{seq:08d}",
            int(time.time()),
            model,
            prompt_tokens,
            completion_tokens(reply, self.tokenizer),
        )
        meta = dialect.annotate(body, chat, reply, meta)
        if body.get("stream") is True:
            events = dialect.stream_events(reply, meta, self.words_per_chunk, _include_usage(body))
            return await self._stream(call, events, meta, fault)
        payload = orjson.dumps(dialect.render(reply, meta), option=orjson.OPT_INDENT_2)
        if fault and fault.malformed:
            payload = payload[: len(payload) // 2]  # truncated JSON, still a 200
        return call.respond(200, payload, "application/json")

    def _record(
        self, request: web.Request, body: JSON | None
    ) -> tuple[int, RecordedRequest | None]:
        self.request_count += 1
        arrival = None
        if self.record:
            headers = Headers(request.headers.items())
            arrival = RecordedRequest(
                body or {}, headers, request.path, time.monotonic(), request.query_string
            )
            self.requests.append(arrival)
        if body and isinstance(body.get("model"), str):
            self.models_seen[body["model"]] = None
        return self.request_count, arrival

    def _auth_error(self, request: web.Request, dialect: Dialect) -> ApiError | None:
        return None if self.api_key is None else dialect.check_auth(request.headers, self.api_key)

    async def _reply(self, chat: JSON) -> Reply:
        if self.responder is None:
            return scripted_reply(chat)
        message = self.responder(chat)
        if inspect.isawaitable(message):
            message = await message
        return limit_reply(reply_from_message(message, chat), chat)

    # --- faults ------------------------------------------------------------------------------

    def _take_fault(self, model: str) -> Fault | None:
        for index, fault in enumerate(self.faults):
            if fault.model is None or fault.model == model:
                fault.times -= 1
                if fault.times <= 0:
                    del self.faults[index]
                return fault
        return None

    async def _fault_answer(self, call: _Call, fault: Fault, model: str) -> web.Response | None:
        """The answer a fault replaces the normal one with, if it does (None: answer normally)."""
        if not await _pause(call.request, fault.delay_s):
            return call.drop(reset=True)
        if fault.reset:
            return call.drop(reset=True)
        if fault.status is None:
            return None
        headers = {}
        if fault.retry_after is not None:
            headers["retry-after"] = f"{fault.retry_after:g}"
        if fault.retry_after_ms is not None:
            headers["retry-after-ms"] = str(fault.retry_after_ms)
        if fault.body is None:
            return call.error(call.dialect.fault_error(fault.status, model), headers)
        if isinstance(fault.body, str):
            kind = "text/html" if fault.body.lstrip().startswith("<") else "text/plain"
            return call.respond(fault.status, fault.body.encode(), kind, headers)
        return call.respond(fault.status, orjson.dumps(fault.body), "application/json", headers)

    async def _stream(
        self, call: _Call, events: list[Event], meta: Meta, fault: Fault | None
    ) -> web.StreamResponse:
        if fault and fault.malformed:
            events.insert(1, Event(call.dialect.garbage_event(meta)))
        cut = fault.cut_after_chunks if fault else None
        if cut is not None:
            events = events[: _cut_index(events, cut)]
        response = await call.start_stream()
        for number, event in enumerate(events):
            if number and not await _pause(call.request, self.chunk_delay_s):
                break
            try:
                await response.write(event.data)
            except ConnectionError:  # the client went away; nothing left to do
                return response
        if cut is not None:
            call.drop(reset=False)
        return response

    # --- model list and control API ----------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        call = _Call(request, OPENAI, "req_sim_models", time.monotonic())
        if error := self._auth_error(request, OPENAI):
            return call.error(error)
        names = ["sim", *(name for name in self.models_seen if name != "sim")]
        data = [
            {"id": name, "object": "model", "created": MODELS_CREATED, "owned_by": "agentproxy"}
            for name in names
        ]
        return call.respond(200, orjson.dumps({"object": "list", "data": data}), "application/json")

    async def _post_faults(self, request: web.Request) -> web.Response:
        try:
            payload = orjson.loads(await request.read())
            items = payload if isinstance(payload, list) else [payload]
            faults = [Fault(**item) for item in items]
        except (orjson.JSONDecodeError, TypeError) as exc:
            return web.json_response({"error": f"bad faults: {exc}"}, status=400)
        self.inject(*faults)
        return web.json_response({"queued": len(self.faults)})

    async def _get_requests(self, request: web.Request) -> web.Response:
        records = [dataclasses.asdict(r) for r in self.requests]
        return web.Response(body=orjson.dumps(records), content_type="application/json")

    async def _delete_requests(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"cleared": True})


class _Call:
    """One model request in flight: renders answers in its dialect with its headers."""

    def __init__(self, request: web.Request, dialect: Dialect, request_id: str, started: float):
        self.request = request
        self.dialect = dialect
        self.request_id = request_id
        self.started = started
        self.dropped = False  # the connection was closed instead of answered
        self.message: str | None = None  # the error it was answered with

    def _headers(self, status: int, extra: dict[str, str] | None = None) -> dict[str, str]:
        elapsed_ms = int((time.monotonic() - self.started) * 1000)
        return self.dialect.headers(self.request_id, elapsed_ms, status) | (extra or {})

    def respond(
        self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None
    ) -> web.Response:
        return web.Response(
            status=status,
            body=body,
            content_type=content_type,
            headers=self._headers(status, extra),
        )

    def error(self, error: ApiError, extra: dict[str, str] | None = None) -> web.Response:
        self.message = error.message
        body = self.dialect.error_body(error, self.request_id)
        payload = orjson.dumps(body, option=orjson.OPT_INDENT_2)
        return self.respond(error.status, payload, "application/json", extra)

    async def start_stream(self) -> web.StreamResponse:
        headers = self._headers(200) | {"Cache-Control": "no-cache"}
        response = web.StreamResponse(status=200, headers=headers)
        response.content_type = "text/event-stream"
        response.charset = "utf-8"
        await response.prepare(self.request)
        return response

    def drop(self, *, reset: bool) -> web.Response:
        """Close the connection: an RST (reset) or a plain close after what was already sent.

        The returned response is never delivered; aiohttp discards it on the dead transport."""
        self.dropped = True
        transport = self.request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if reset and sock is not None:
                # Linger 0 turns close into an RST, like a crashed upstream or a killed LB.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if reset:
                transport.abort()
            else:
                transport.close()
        return web.Response(status=500)


def _json_object(raw: bytes) -> JSON | None:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def _include_usage(body: JSON) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _cut_index(events: list[Event], chunks: int) -> int:
    """Where to cut so exactly `chunks` content events go out (never the final event)."""
    seen = 0
    for index, event in enumerate(events):
        if event.content:
            if seen == chunks:
                return index
            seen += 1
    return len(events) - 1


async def _pause(request: web.Request, seconds: float) -> bool:
    """Sleep, but wake early (returning False) when the server shuts down, so stopping a
    simulator never waits for a scripted delay to run out."""
    if seconds <= 0:
        return True
    try:
        await asyncio.wait_for(request.app[_CLOSING].wait(), seconds)
    except TimeoutError:
        return True
    return False


async def _wake_sleepers(app: web.Application) -> None:
    app[_CLOSING].set()


@asynccontextmanager
async def run_simulator(
    sim: Simulator, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """Serve `sim` on host:port (0 = any free port); yields the root URL, e.g.
    "http://127.0.0.1:8123" (OpenAI clients want that + "/v1", Anthropic ones the root)."""
    runner = web.AppRunner(sim.app(), handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await start_site(site, host, port, "pick another with --port N")
        bound_port = runner.addresses[0][1]
        shown_host = f"[{host}]" if ":" in host else host
        yield f"http://{shown_host}:{bound_port}"
    finally:
        await runner.cleanup()


async def serve_simulator(host: str, port: int, sim: Simulator) -> None:
    """Run until cancelled; prints one line once listening (the CLI's `agentproxy simulate`)."""
    async with run_simulator(sim, host, port) as url:
        print(f"simulated upstream on {url}/v1", flush=True)
        await asyncio.Event().wait()


def compacted_window(body: JSON, seq: int) -> JSON:
    """OpenAI's CompactedResponse for `body`: its user messages, then an opaque item."""
    raw = body.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw or []
    users = [
        {"type": "message", **i, "content": _parts(i.get("content"))}
        for i in items
        if isinstance(i, dict) and i.get("type", "message") == "message" and i.get("role") == "user"
    ]
    digest = hashlib.sha256(orjson.dumps(items)).hexdigest()
    item = {"type": "compaction", "id": f"cmp_sim{seq:08d}", "encrypted_content": f"gAAAAA{digest}"}
    usage = {
        "input_tokens": len(orjson.dumps(items)) // 4,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 64,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": len(orjson.dumps(items)) // 4 + 64,
    }
    return {
        "id": f"resp_simcmp{seq:08d}",
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [*users, item],
        "usage": usage,
    }


def _parts(content: Any) -> Any:
    """A message's text as input_text parts (how an output item carries a user message)."""
    return [{"type": "input_text", "text": content}] if isinstance(content, str) else content
