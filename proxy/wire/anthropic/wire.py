"""Anthropic Messages as a `Wire`."""

from proxy.wire.anthropic import one_shot, replies, route
from proxy.wire.anthropic.answer import AnthropicAnswer
from proxy.wire.anthropic.conversation import AnthropicConversation
from proxy.wire.anthropic.request import implied_headers
from proxy.wire.anthropic.upstream import AnthropicUpstream, anthropic_usage
from proxy.wire.base import WireFormat

ANTHROPIC = WireFormat(
    name="anthropic",
    routes=route.routes,
    model_route=route.MESSAGES_ROUTE,
    provider="anthropic",
    assembly=AnthropicAnswer,
    conversation=AnthropicConversation(),
    native=AnthropicUpstream,
    error_shape=replies.error_body,
    usage_of=anthropic_usage,
    one_shot=one_shot.ONE_SHOT,
    key_headers=("x-api-key",),
    implied_headers=implied_headers,
)
