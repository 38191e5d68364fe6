"""Google Gemini (generateContent) as a `Wire`."""

from proxy.wire.base import WireFormat
from proxy.wire.gemini import one_shot, replies, route
from proxy.wire.gemini.upstream import GeminiUpstream, gemini_usage

GEMINI = WireFormat(
    name="gemini",
    routes=route.routes,
    native=GeminiUpstream,
    error_paths=("/v1beta/", "/v1/models/"),  # OpenAI's list is /v1/models, with no slash
    error_shape=replies.error_body,
    usage_of=gemini_usage,
    one_shot=one_shot.ONE_SHOT,
)
