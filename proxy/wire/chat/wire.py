"""OpenAI Chat Completions as a `Wire`: the shared transports speak it, so it has no native
upstream of its own, and its errors are OpenAI's envelope (the default)."""

from proxy.wire.base import ModelList, WireFormat
from proxy.wire.chat import route
from proxy.wire.chat.answer import ChatAnswer
from proxy.wire.chat.conversation import ChatConversation

CHAT = WireFormat(
    name="chat",
    routes=route.routes,
    model_route=route.CHAT_ROUTE,
    provider="openai",
    assembly=ChatAnswer,
    conversation=ChatConversation(),
    model_list=ModelList(("/v1/models",), route.model_list),
)
