"""Every non-OpenAI-compatible provider, through litellm. The only module that imports it.

`import litellm` costs seconds and ~190 MB, so it happens lazily, in a worker thread, the first
time a deployment needs it (`warm_up` starts that early when the config has such deployments).
litellm's own retries are off: the proxy has exactly one retry loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from types import ModuleType
from typing import Any

import orjson

from proxy.errors import (
    BadRequest,
    InternalError,
    UpstreamBadResponse,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from proxy.exchange import Usage
from proxy.policies.spec import Deployment, ServerSettings
from proxy.redaction import redact_urls_in, without_traceback
from proxy.upstream.base import UpstreamHTTPError, UpstreamReply, forwarded_headers
from proxy.upstream.litellm_request import completion_arguments
from proxy.upstream.openai_compat import REDACTED

log = logging.getLogger("agentproxy.litellm")

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def _import_litellm() -> ModuleType:
    # The price map ships inside the package; never fetch it over the network.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    litellm.num_retries = 0
    _log_through_ours()
    # litellm brings ~340k long-lived objects; each full collection walked them all (~200 ms,
    # measured: every request in flight stalled). Frozen, the collector skips them.
    gc.freeze()
    return litellm


LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")


def _log_through_ours() -> None:
    """litellm's loggers write through a handler of their own (plain text, even with
    server.log_format: json, and again through ours): their records go through the process's
    handlers alone. The handler's filters (litellm's secret redaction) move to the logger."""
    for name in LITELLM_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            for kept in handler.filters:
                if kept not in logger.filters:
                    logger.addFilter(kept)


class LiteLLMUpstream:
    """litellm reads the provider's bytes itself (httpx/aiohttp inside it), so the proxy's size
    caps cannot reach those reads. What is bounded here: a non-streaming call's total time
    (server.response_timeout_s), and a client that leaves cancels the call (the connection
    closes)."""

    @staticmethod
    def usage(data: dict[str, Any]) -> Usage | None:
        return Usage.of(data.get("usage"))  # litellm answers in Chat Completions' shape

    def __init__(self, settings_source: Callable[[], ServerSettings] | None = None) -> None:
        self._settings = settings_source or ServerSettings
        self._module: ModuleType | None = None
        self._loading: asyncio.Task[ModuleType] | None = None

    @property
    def loaded(self) -> bool:
        return self._module is not None

    def warm_up(self) -> None:
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load())

    async def _load(self) -> ModuleType:
        try:
            self._module = await asyncio.to_thread(_import_litellm)
        except Exception:
            log.exception("importing litellm failed; non-OpenAI deployments cannot be served")
            self._loading = None  # the next request tries again
            raise
        return self._module

    async def module(self) -> ModuleType:
        if self._module is None:
            self.warm_up()
            assert self._loading is not None
            return await asyncio.shield(self._loading)
        return self._module

    async def close(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()

    async def complete(
        self,
        deployment: Deployment,
        body: dict[str, Any],
        request_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> UpstreamReply:
        arguments = completion_arguments(deployment, body, stream=False)
        litellm = await self.module()
        limit = self._settings().response_timeout_s
        try:
            async with asyncio.timeout(limit) as scope:
                response = await litellm.acompletion(**arguments)
        except TimeoutError as exc:
            if not scope.expired():
                raise self._translate(litellm, deployment, exc) from exc
            raise UpstreamTimeout(
                f"the upstream for '{deployment.alias}' did not finish its reply within "
                f"{limit:g}s; raise server.response_timeout_s if this model's non-streaming "
                "answers take longer (or stream them)"
            ) from None
        except Exception as exc:
            raise self._translate(litellm, deployment, exc) from exc
        data = response.model_dump(exclude_none=True)
        raw = orjson.dumps(data)
        for secret in secrets_of(deployment):
            if secret in raw:  # a provider echoing its key
                raw = raw.replace(secret, REDACTED)
                data = orjson.loads(raw)
        return UpstreamReply(data, raw)

    async def open_stream(
        self,
        deployment: Deployment,
        body: dict[str, Any],
        request_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> LiteLLMStream:
        arguments = completion_arguments(deployment, body, stream=True)
        litellm = await self.module()
        try:
            stream = await litellm.acompletion(**arguments)
        except Exception as exc:
            raise self._translate(litellm, deployment, exc) from exc
        return LiteLLMStream(
            stream,
            lambda exc: self._translate(litellm, deployment, exc, called=True),
            secrets_of(deployment),
        )

    def _translate(
        self, litellm: ModuleType, deployment: Deployment, exc: Exception, *, called: bool = False
    ) -> Exception:
        """`called`: the provider is known to have been called (a stream it began)."""
        name = deployment.alias
        raw = str(exc).encode()
        for secret in secrets_of(deployment):
            raw = raw.replace(secret, REDACTED)
        text = str(raw, "utf-8", "replace")
        # litellm's messages may quote the api_base, and a traceback of its own code.
        message = redact_urls_in(without_traceback(text))
        if isinstance(exc, litellm.Timeout):
            return UpstreamTimeout(
                f"the upstream for '{name}' timed out ({message}); raise "
                f"litellm_params.timeout of '{name}' if this model needs longer"
            )
        if not called and not _came_from_the_provider(exc):
            root = _root_cause(exc)
            if isinstance(root, ValueError) and _raised_in(root, "tool"):
                # litellm's own check of a tool it cannot map to this provider (an unknown
                # type, a computer tool without its display size): the client's field.
                refused = BadRequest(
                    f"'tools' cannot be sent to '{name}': {_first_line(message)[:200]}",
                    param="tools",
                )
                refused.unsent = True
                return refused
            # litellm's own translation failed (it calls that a connection error too): the
            # provider was never called, so this is no upstream failure to retry or to count
            # against the deployment's circuit. Logged in one line: litellm's chain is three
            # tracebacks of its own code; the whole chain is kept for DEBUG.
            log.info(
                "litellm failed before calling '%s': %s: %s",
                name,
                type(root).__name__,
                _first_line(message),
                exc_info=exc if log.isEnabledFor(logging.DEBUG) else None,
            )
            failed = InternalError(
                f"the request for '{name}' could not be translated to its provider: "
                f"{_first_line(message)}",
                code="translation_failed",
            )
            failed.unsent = True
            return failed
        if isinstance(exc, litellm.APIConnectionError):
            return UpstreamUnreachable(f"the upstream for '{name}' is unreachable: {message}")
        status = getattr(exc, "status_code", None)
        if isinstance(status, int) and 400 <= status < 600:
            code = (
                "context_length_exceeded"
                if isinstance(exc, litellm.ContextWindowExceededError)
                else None
            )
            body = {
                "error": {
                    "message": message,
                    "type": _ERROR_TYPES.get(status, "api_error"),
                    "param": None,
                    "code": code,
                }
            }
            # The provider's rate-limit hints (Retry-After), when litellm kept its headers.
            headers = getattr(exc, "litellm_response_headers", None)
            return UpstreamHTTPError(
                status, orjson.dumps(body), forwarded_headers(headers) if headers else {}
            )
        return UpstreamBadResponse(f"the upstream for '{name}' failed: {message}")


# litellm_params whose values are credentials (api_key, aws_secret_access_key,
# aws_session_token, vertex_credentials, ...): never shown to a client.
_SECRET_PARAM_WORDS = ("key", "secret", "token", "credential", "password")


def secrets_of(deployment: Deployment) -> tuple[bytes, ...]:
    """The deployment's configured credentials, as they would appear in a body."""
    found = {deployment.api_key} if deployment.api_key else set()
    for name, value in deployment.litellm_params.items():
        if isinstance(value, str) and any(word in name for word in _SECRET_PARAM_WORDS):
            found.add(value)
    return tuple(s.encode() for s in found if len(s) >= 4)  # as redact() does


# Where a failure that reached the network shows in an exception's cause chain.
_NETWORK_MODULES = ("httpx", "httpcore", "aiohttp", "ssl", "socket", "h11", "anyio")
# litellm's functions that read a provider's answer: a crash in one of them is a garbled
# answer (the provider was called), not a request litellm could not translate.
_RESPONSE_FRAMES = frozenset(
    {"transform_response", "transform_parsed_response", "convert_to_model_response_object",
     "process_response", "chunk_parser"}
)  # fmt: skip


def _came_from_the_provider(exc: BaseException) -> bool:
    """Whether litellm got as far as the provider: an error with an HTTP status, one caused
    (somewhere in its chain) by the network, or one raised reading the provider's answer.
    litellm wraps a crash in its own translation of the request as an APIConnectionError; its
    chain then holds only Python's errors, raised before any answer was read."""
    if isinstance(getattr(exc, "status_code", None), int) and not _is_connection_error(exc):
        return True
    seen: BaseException | None = exc
    for _ in range(16):  # chains are short; a cycle must not loop forever
        if seen is None:
            return False
        if isinstance(seen, OSError) or type(seen).__module__.split(".")[0] in _NETWORK_MODULES:
            return True
        if _read_an_answer(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return True


def _read_an_answer(exc: BaseException) -> bool:
    frame = exc.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code.co_name in _RESPONSE_FRAMES:
            return True
        frame = frame.tb_next
    return False


def _is_connection_error(exc: BaseException) -> bool:
    return type(exc).__name__ in ("APIConnectionError", "Timeout") or isinstance(exc, TimeoutError)


def _root_cause(exc: BaseException) -> BaseException:
    """The first error of a chain (litellm wraps its own crash in APIConnectionError)."""
    for _ in range(16):  # chains are short; a cycle must not loop forever
        cause = exc.__cause__ or exc.__context__
        if cause is None:
            break
        exc = cause
    return exc


def _raised_in(exc: BaseException, word: str) -> bool:
    """Whether the function that raised `exc` has `word` in its name."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and word in frame.tb_frame.f_code.co_name


def _first_line(message: str) -> str:
    return message.split("\n", 1)[0].removeprefix("litellm.APIConnectionError: ")


class LiteLLMStream:
    """litellm's chunk objects, re-encoded as OpenAI SSE events."""

    headers: dict[str, str]

    def __init__(self, stream: Any, translate: Any, secrets: tuple[bytes, ...] = ()) -> None:
        self._stream = stream
        self._translate = translate
        self._secrets = secrets  # the deployment's credentials, never relayed
        self.headers = {}

    async def events(self) -> AsyncIterator[list[bytes]]:
        try:
            async for chunk in self._stream:
                event = b"data: " + orjson.dumps(chunk.model_dump(exclude_none=True))
                for secret in self._secrets:
                    if secret in event:
                        event = event.replace(secret, REDACTED)
                yield [event]
        except Exception as exc:
            raise self._translate(exc) from exc
        yield [b"data: [DONE]"]

    async def close(self) -> None:
        closer = getattr(self._stream, "aclose", None)
        if closer is not None:
            # Closing a finished stream must not mask the real outcome.
            with contextlib.suppress(Exception):
                await closer()
