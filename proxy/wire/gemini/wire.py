"""Google Gemini (generateContent) as a `Wire`."""

from proxy.wire.base import ModelList, WireFormat
from proxy.wire.gemini import one_shot, replies, route
from proxy.wire.gemini.conversation import GeminiConversation
from proxy.wire.gemini.upstream import GeminiUpstream, gemini_usage

GEMINI = WireFormat(
    name="gemini",
    routes=route.routes,
    model_route=route.GENERATE_ROUTE,  # replay fills in the turn's model
    provider="gemini",
    assembly=replies.Assembly,
    conversation=GeminiConversation(),
    native=GeminiUpstream,
    paths=("/v1beta/",),  # a path it does not serve there still gets Google's envelope
    error_shape=replies.error_body,
    usage_of=gemini_usage,
    usage_key="usageMetadata",
    one_shot=one_shot.ONE_SHOT,
    model_list=ModelList(route.LIST_PATHS, route.model_list, in_manner=route.wants_gemini),
    key_headers=(route.KEY_HEADER,),
    key_query=route.KEY_QUERY,  # as curl users send it
)
