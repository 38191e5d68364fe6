"""Extended thinking in the Anthropic twin: the `thinking` setting, signed thinking blocks, and
the rules the real API applies to them on the way back in.

A thinking block's `signature` is minted here (an HMAC of the block's text under a secret each
Simulator draws for itself), so a block whose text or signature was changed on its way back —
by a proxy, say — is refused with the API's own 400, as is a tool loop whose assistant turn lost
its thinking block while thinking is on ("enabled" or "adaptive"). Thinking is emitted only when
the request asks for it; without it, the loop rule does not apply.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from .model import JSON, Reply, text_of
from .wire import ApiError

THINKING_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
MIN_BUDGET_TOKENS = 1024
DISPLAYS = ("summarized", "omitted")
THINKING_TYPES = ("enabled", "disabled", "adaptive")
# A user text containing this makes the real API answer with a redacted_thinking block.
REDACTED_TRIGGER = (
    "ANTHROPIC_MAGIC_STRING_TRIGGER_REDACTED_THINKING_"
    "46C9A13E193C177646C7398A98432ECCCE4C1253D5E2D82641AC0E52CC2876CB"
)
_SIGNATURE_VERSION = b"\x01"
_REDACTED_VERSION = b"\x02"
_NONCE_BYTES = 16
_MAC_BYTES = 32


@dataclass(frozen=True)
class ThinkingSetting:
    """What the request's `thinking` asks for; `on` unless its type is "disabled"."""

    type: str
    display: str = "summarized"
    budget_tokens: int | None = None

    @property
    def on(self) -> bool:
        return self.type != "disabled"


@dataclass(frozen=True)
class ThinkingBlock:
    """The block a reply starts with: `thinking` as shown (empty when display is "omitted"),
    or, when `redacted`, a redacted_thinking block whose data is `signature`."""

    thinking: str
    signature: str
    tokens: int  # what the hidden reasoning cost, counted in output_tokens
    redacted: bool = False

    def wire(self) -> JSON:
        if self.redacted:
            return {"type": "redacted_thinking", "data": self.signature}
        return {"type": "thinking", "thinking": self.thinking, "signature": self.signature}


def thinking_setting(body: JSON) -> ThinkingSetting | ApiError | None:
    """The request's thinking setting, or the 400 the API gives for a malformed one."""
    if "thinking" not in body:
        return None
    value = body["thinking"]
    if not isinstance(value, dict):
        return ApiError(400, "thinking: Input should be a valid dictionary or object")
    kind = value.get("type")
    if kind not in THINKING_TYPES:
        expected = ", ".join(f"'{t}'" for t in THINKING_TYPES)
        return ApiError(
            400,
            f"thinking: Input tag '{kind}' found using 'type' does not match any of the "
            f"expected tags: {expected}",
        )
    display = value.get("display", "summarized")
    if kind != "disabled" and display not in DISPLAYS:
        return ApiError(400, f"thinking.{kind}.display: Input should be 'summarized' or 'omitted'")
    if kind != "enabled":
        return ThinkingSetting(str(kind), str(display))
    budget = value.get("budget_tokens")
    if budget is None:
        return ApiError(400, "thinking.enabled.budget_tokens: Field required")
    if not isinstance(budget, int) or isinstance(budget, bool):
        return ApiError(400, "thinking.enabled.budget_tokens: Input should be a valid integer")
    if budget < MIN_BUDGET_TOKENS:
        return ApiError(
            400,
            "thinking.enabled.budget_tokens: Input should be greater than or equal to "
            f"{MIN_BUDGET_TOKENS}",
        )
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and max_tokens <= budget:
        return ApiError(
            400,
            "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
            f"documentation at {THINKING_DOCS}#max-tokens-and-context-window-size",
        )
    return ThinkingSetting("enabled", str(display), budget)


class Signer:
    """Mints and checks thinking signatures and redacted_thinking data under one secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        # Blocks another API minted, taken as this one's (a replay of a recorded session):
        # (signature, thinking) pairs and redacted data, each valid only exactly as vouched.
        self._vouched: set[tuple[str, str]] = set()

    def vouch(self, messages: list[Any]) -> None:
        """Take the thinking blocks of a history as minted here."""
        for message in messages:
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            for block in _blocks(message):
                kind = block.get("type") if isinstance(block, dict) else None
                if kind == "thinking":
                    signature, thinking = block.get("signature"), block.get("thinking")
                    if isinstance(signature, str) and isinstance(thinking, str):
                        self._vouched.add((signature, thinking))
                elif kind == "redacted_thinking" and isinstance(data := block.get("data"), str):
                    self._vouched.add((data, ""))

    def _mac(self, kind: bytes, nonce: bytes, text: str) -> bytes:
        return hmac.new(self._secret, kind + nonce + text.encode(), hashlib.sha256).digest()

    def _nonce(self, seed: str) -> bytes:
        return self._mac(b"nonce", b"", seed)[:_NONCE_BYTES]

    def sign(self, shown: str, seed: str) -> str:
        """A signature for a thinking block showing `shown`; `seed` (the hidden reasoning and
        the request) makes each one distinct, so an omitted "" is not one shared signature."""
        nonce = self._nonce(seed)
        mac = self._mac(_SIGNATURE_VERSION, nonce, shown)
        return base64.b64encode(_SIGNATURE_VERSION + nonce + mac).decode()

    def redacted_data(self, seed: str) -> str:
        nonce = self._nonce(seed)
        mac = self._mac(_REDACTED_VERSION, nonce, "")
        return base64.b64encode(_REDACTED_VERSION + nonce + mac).decode()

    def _valid(self, version: bytes, encoded: str, text: str) -> bool:
        try:
            raw = base64.b64decode(encoded, validate=True)
        except ValueError:
            return False
        if len(raw) != 1 + _NONCE_BYTES + _MAC_BYTES or raw[:1] != version:
            return False
        nonce, mac = raw[1 : 1 + _NONCE_BYTES], raw[1 + _NONCE_BYTES :]
        return hmac.compare_digest(mac, self._mac(version, nonce, text))

    def valid_signature(self, signature: str, thinking: str) -> bool:
        vouched = (signature, thinking) in self._vouched
        return vouched or self._valid(_SIGNATURE_VERSION, signature, thinking)

    def valid_redacted(self, data: str) -> bool:
        return (data, "") in self._vouched or self._valid(_REDACTED_VERSION, data, "")


def _blocks(message: JSON) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def check_thinking_blocks(messages: list[JSON], signer: Signer) -> ApiError | None:
    """Every thinking / redacted_thinking block in the history is one this API minted, as is."""
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        for k, block in enumerate(_blocks(message)):
            if not isinstance(block, dict):
                continue
            where = f"messages.{i}.content.{k}"
            if block.get("type") == "thinking":
                for field in ("thinking", "signature"):
                    if not isinstance(block.get(field), str):
                        return ApiError(400, f"{where}.thinking.{field}: Field required")
                if not signer.valid_signature(block["signature"], block["thinking"]):
                    return ApiError(400, f"{where}: Invalid `signature` in `thinking` block")
            elif block.get("type") == "redacted_thinking":
                data = block.get("data")
                if not isinstance(data, str):
                    return ApiError(400, f"{where}.redacted_thinking.data: Field required")
                if not signer.valid_redacted(data):
                    return ApiError(400, f"{where}: Invalid `data` in `redacted_thinking` block")
    return None


def check_tool_loop_thinking(messages: list[JSON]) -> ApiError | None:
    """With thinking on, a request that continues a tool loop (it ends with tool results) must
    give back the thinking its assistant turn started with: a tool loop is one assistant turn,
    so the first assistant message of the loop starts with a thinking (or redacted_thinking)
    block; the later ones need not (a model thinks once per turn without interleaved
    thinking). With thinking off (or not asked for) the rule does not apply."""
    turns = [(i, m) for i, m in enumerate(messages) if m.get("role") != "system"]
    start: int | None = None
    at = len(turns) - 1
    while at >= 1:
        (i, asked), (_, answer) = turns[at - 1], turns[at]
        answers = any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in _blocks(answer)
        )
        calls = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in _blocks(asked))
        if answer.get("role") != "user" or asked.get("role") != "assistant":
            break
        if not answers or not calls:
            break
        start = i
        at -= 2
    if start is None:
        return None
    blocks = _blocks(messages[start])
    first = blocks[0].get("type") if isinstance(blocks[0], dict) else None
    if first in ("thinking", "redacted_thinking"):
        return None
    return ApiError(
        400,
        f"messages.{start}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
        f"found `{first}`. When `thinking` is enabled, a final `assistant` message must start "
        "with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` "
        "blocks). We recommend you include thinking blocks from previous turns. To avoid this "
        f"requirement, disable `thinking`. Please consult our documentation at {THINKING_DOCS}",
    )


def reasoning_for(reply: Reply, chat: JSON) -> str:
    """The scripted model's (hidden) reasoning before `reply`: a deterministic plan."""
    if reply.tool_calls:
        names = ", ".join(call.name for call in reply.tool_calls)
        return f"To answer this I need more information, so I will call {names} first."
    last = chat["messages"][-1] if chat.get("messages") else {}
    if last.get("role") == "tool":
        return "The tool results are in; I can answer from them now."
    return "This needs no tools; I can answer directly."


def wants_redacted(chat: JSON) -> bool:
    return any(
        REDACTED_TRIGGER in text_of(m.get("content"))
        for m in chat.get("messages") or []
        if m.get("role") == "user"
    )
