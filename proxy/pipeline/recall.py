"""The proxy's own tool, `agentproxy_recall`: the model reads back what left its context.

Offered only when this request's history points into the archive (an offload pointer, a
truncated argument, a summary). When the model calls it, the proxy answers from the store and
calls the model again; the client never sees that exchange.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.exchange import Exchange
from proxy.messages import Message
from proxy.sessions.identity import may_read
from proxy.store.base import BlobInfo, Store, StoreError

TOOL_NAME = "agentproxy_recall"
# Rewrites after which the history refers to archived content.
ARCHIVING_ACTIONS = frozenset(
    {
        ("repair", "archived"),
        ("offload", "offloaded"),
        ("compaction", "truncated_arguments"),
        ("compaction", "summarized"),
        ("compaction", "checkpoint_reused"),
        ("compaction", "middle_out"),
        ("context_edits", "cleared_tool_uses"),
        ("context_edits", "compacted"),
        ("capabilities", "removed_images"),
        ("capabilities", "removed_documents"),
        ("capabilities", "removed_reasoning"),
    }
)
USAGE = 'pass {"ref": "ap_…"} to fetch archived content, or {"query": "…"} to search it'
MAX_RECALL_CHARS = 60_000  # one answer never floods the context it is meant to relieve

TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Read content that was moved out of this conversation to save context: pass `ref` "
            "(an ap_… reference shown in the conversation) to fetch it, or `query` to search "
            "all archived content of this session for a phrase."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "ref": {"type": "string", "description": "an ap_… reference"},
                "query": {"type": "string", "description": "a phrase to search for"},
                "offset": {"type": "integer", "description": "character offset to read from"},
            },
        },
    },
}


def should_offer(ex: Exchange) -> bool:
    if not ex.policy.recall.enabled or ex.body.get("tool_choice") == "none":
        return False
    if any(note.action == "removed_tools" for note in ex.notes):  # a model without tools
        return False
    return any((note.stage, note.action) in ARCHIVING_ACTIONS for note in ex.notes)


def offer(body: dict[str, Any]) -> None:
    tools = body.get("tools") or []
    if not any(_name(t) == TOOL_NAME for t in tools):
        body["tools"] = [*tools, TOOL]


def offered(body: dict[str, Any]) -> bool:
    return any(_name(t) == TOOL_NAME for t in body.get("tools") or [])


def withdraw(body: dict[str, Any]) -> None:
    tools = [t for t in body.get("tools") or [] if _name(t) != TOOL_NAME]
    if tools:
        body["tools"] = tools
    else:
        body.pop("tools", None)


def split_calls(message: Message) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(recall calls, the client's own calls) of an assistant message."""
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for call in message.get("tool_calls") or []:
        (ours if _call_name(call) == TOOL_NAME else theirs).append(call)
    return ours, theirs


async def answer(ex: Exchange, calls: list[dict[str, Any]], store: Store) -> list[Message]:
    """One tool message per recall call, in call order."""
    return [
        {
            "role": "tool",
            "tool_call_id": call.get("id", ""),
            "content": await _answer(ex, call, store),
        }
        for call in calls
    ]


async def _answer(ex: Exchange, call: dict[str, Any], store: Store) -> str:
    try:
        arguments = orjson.loads(call.get("function", {}).get("arguments") or "{}")
    except orjson.JSONDecodeError:
        return 'error: the arguments were not valid JSON; pass {"ref": "ap_…"} or {"query": "…"}'
    if not isinstance(arguments, dict):
        arguments = {}
    try:
        if isinstance(arguments.get("ref"), str):
            return await _fetch(ex, arguments["ref"], arguments.get("offset"), store)
        if isinstance(arguments.get("query"), str) and arguments["query"].strip():
            return await _search(ex, arguments["query"].strip(), store)
    except StoreError as exc:
        return f"error: the archive is unavailable right now ({exc})"
    return 'error: pass {"ref": "ap_…"} to fetch archived content or {"query": "…"} to search it'


async def _fetch(ex: Exchange, ref: str, offset: Any, store: Store) -> str:
    found = await store.get(ref.strip())
    if found is None or not _in_session(ex, found[0]):
        return f"error: no archived content {ref!r} in this session"
    text = found[1].decode("utf-8", "replace")
    start = offset if isinstance(offset, int) and 0 <= offset < len(text) else 0
    part = text[start : start + MAX_RECALL_CHARS]
    if start + len(part) < len(text):
        part += (
            f"\n[agentproxy] {len(text) - start - len(part)} more characters; call again with "
            f'{{"ref": "{ref}", "offset": {start + len(part)}}}'
        )
    return part


async def _search(ex: Exchange, query: str, store: Store) -> str:
    hits = [
        (info, snippet)
        for info, snippet in await store.search(ex.identity.session, query)
        if _in_session(ex, info)
    ]
    if not hits:
        return f"no archived content of this session mentions {query!r}"
    return "\n\n".join(f"{info.ref} ({info.kind}): …{snippet}…" for info, snippet in hits)


def _in_session(ex: Exchange, info: BlobInfo) -> bool:
    """The caller's own session's blob (or, stored before sessions were scoped, its key's)."""
    if info.session not in (ex.identity.session, ex.identity.session_name):
        return False
    return may_read(ex.identity.owner, ex.identity.key, info.owner)


def _name(tool: Any) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def _call_name(call: Any) -> str | None:
    return _name(call)
