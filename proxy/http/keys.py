"""What a request carries through the HTTP shell: set by the routes and the flow, read by the
middleware when it counts and logs the request."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from proxy.errors import ProxyError
from proxy.exchange import Exchange

REQUEST_ID = web.RequestKey("request_id", str)
# Set by handlers once the model alias is known to be configured (bounded metric labels).
MODEL_LABEL = web.RequestKey("model_label", str)
# Set by handlers when the client hung up mid-response; counted as status 499.
CLIENT_GONE = web.RequestKey("client_gone", bool)
STATUS_CLIENT_GONE = 499
# Set by handlers when the request failed after its status went out (a stream cut midway):
# it is counted and logged with this status, not the 200 the client saw first.
OUTCOME_STATUS = web.RequestKey("outcome_status", int)
# The request's body as received (bytes, unparsed): what a recorded session keeps.
RAW_BODY = web.RequestKey("raw_body", bytes)
# How the app frames a proxy error: (the matched route's path, or None; the request's path;
# the error; its request id) -> the body in that route's wire (proxy/wire/base.py: ErrorFrames).
ErrorBody = Callable[[str | None, str, ProxyError, str | None], Mapping[str, Any]]
ERROR_BODY: web.AppKey[ErrorBody] = web.AppKey("error_body")
# The request's Exchange once its route opened one: the access line tells what it did.
EXCHANGE = web.RequestKey("exchange", Exchange)
