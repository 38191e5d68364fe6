"""OpenAI Responses as a `Wire` (its errors are OpenAI's envelope, the default)."""

from proxy.wire.base import WireFormat
from proxy.wire.responses import route
from proxy.wire.responses.upstream import ResponsesUpstream, responses_usage

RESPONSES = WireFormat(
    name="responses", routes=route.routes, native=ResponsesUpstream, usage_of=responses_usage
)
