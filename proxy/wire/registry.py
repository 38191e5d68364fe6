"""Every wire format the proxy serves: adding one is a folder under proxy/wire/ and a line here."""

from proxy.wire.anthropic.wire import ANTHROPIC
from proxy.wire.base import Wire
from proxy.wire.chat.wire import CHAT
from proxy.wire.gemini.wire import GEMINI
from proxy.wire.responses.wire import RESPONSES

WIRES: tuple[Wire, ...] = (CHAT, ANTHROPIC, RESPONSES, GEMINI)
