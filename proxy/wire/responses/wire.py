"""OpenAI Responses as a `Wire` (its errors are OpenAI's envelope, the default)."""

from proxy.wire.base import WireFormat
from proxy.wire.responses import one_shot, route
from proxy.wire.responses.answer import ResponsesAnswer
from proxy.wire.responses.conversation import ResponsesConversation
from proxy.wire.responses.upstream import (
    ResponsesCompactUpstream,
    ResponsesUpstream,
    responses_usage,
)

RESPONSES = WireFormat(
    name="responses",
    routes=route.routes,
    model_route=route.RESPONSES_ROUTE,
    provider="openai",
    assembly=ResponsesAnswer,
    conversation=ResponsesConversation(),
    native=ResponsesUpstream,
    usage_of=responses_usage,
    one_shot=one_shot.ONE_SHOT,
    extra_natives=(ResponsesCompactUpstream,),
)
