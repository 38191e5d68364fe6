"""A fallback re-fits capabilities: the history adapted to what the fallback model takes.

The alias a client asked for may take images, documents, tools, reasoning and long answers
that its fallback does not; sent as it is, the fallback answers 400 and the request fails
after all. So once a fallback took over (control's `switch` → Rewriter.refit), this stage
reads the fallback's capabilities (proxy/model_catalog.py: `model_info`, else litellm's model
map; unknown = assumed supported, nothing is stripped that may work) and takes out of the
request what it lacks:

- images (chat `image_url`, Anthropic `image`, Responses `input_image`) without
  `supports_vision`, documents (chat `file`, Anthropic `document`, Responses `input_file`)
  without `supports_pdf_input`: each archived, and replaced by a text marker naming its ref;
- signed reasoning (Anthropic thinking blocks, Responses reasoning items, chat
  `reasoning_content` and kin) without `supports_reasoning`, or when the fallback is another
  signer (provider and address) than the alias asked for: archived, left out (the view does it
  for what it does not show); the request's reasoning setting too without `supports_reasoning`;
- tools without `supports_function_calling`: the definitions archived and left out, past calls
  and results written as text (and the reasoning of those turns archived and left out: a
  provider refuses reasoning without the calls it led to);
- `max_tokens` / `max_completion_tokens` / `max_output_tokens` above the model's
  `max_output_tokens`: clamped.

Store before removal (archive.py): what failed to store stays. Each adaptation is one event,
`capabilities.<action>` with its count and refs (a rewrite metric, a header note). The
top-level fields it changes are kept as sent (`ex.client.fields_sent`) and put back by
`restore` before the next fallback fits the request again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.exchange import Exchange, NativeFit
from proxy.messages import Message, call_body, text_of
from proxy.model_catalog import ModelFacts
from proxy.pipeline.archive import entry
from proxy.pipeline.base import StageContext, record
from proxy.pipeline.offload import ARCHIVE_PATH, RECALL_TOOL
from proxy.policies.spec import Deployment, Policy

STAGE = "capabilities"
IMAGES = frozenset({"image_url", "image", "input_image"})
DOCUMENTS = frozenset({"file", "document", "input_file"})
# Reasoning an assistant message of a chat history may carry back (DeepSeek, OpenRouter, litellm).
CHAT_REASONING = ("reasoning_content", "reasoning", "thinking_blocks", "reasoning_details")
CHAT_REASONING_SETTINGS = ("reasoning_effort", "thinking")
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")
CHAT_LIMITS = ("max_tokens", "max_completion_tokens")
# Actions after which the history names archived content (recall.ARCHIVING_ACTIONS).
ARCHIVING = ("removed_images", "removed_documents", "removed_reasoning")
REMOVED_TOOLS = "removed_tools"


@dataclass(frozen=True, slots=True)
class Lacks:
    """What the fallback cannot take, of what requests may hold."""

    vision: bool = False
    documents: bool = False
    tools: bool = False
    reasoning: bool = False  # it does not reason: no reasoning setting either
    signatures: bool = False  # another signer: the history's signed reasoning is void there
    max_output_tokens: int | None = None

    @property
    def anything(self) -> bool:
        return (
            self.vision
            or self.documents
            or self.tools
            or self.reasoning
            or self.signatures
            or self.max_output_tokens is not None
        )


def lacks(ex: Exchange, facts: ModelFacts, requested: tuple[Deployment, ...]) -> Lacks:
    deployment = ex.deployment
    assert deployment is not None
    signer = _signer(deployment)
    return Lacks(
        vision=facts.supports_vision is False,
        documents=facts.supports_pdf_input is False,
        tools=facts.supports_function_calling is False,
        reasoning=facts.supports_reasoning is False,
        signatures=bool(requested) and all(_signer(d) != signer for d in requested),
        max_output_tokens=facts.max_output_tokens,
    )


def _signer(deployment: Deployment) -> tuple[str, str | None]:
    return deployment.provider, deployment.base_url


def restore(ex: Exchange) -> None:
    """The request's top-level fields as the client sent them, before another fallback."""
    sent = ex.client.fields_sent
    for name, (present, value) in sent.items():
        if present:
            ex.body[name] = value
        else:
            ex.body.pop(name, None)
    sent.clear()
    if ex.client.renderer is not None:
        ex.client.renderer.fit(NativeFit())


class CapabilityStage:
    """Runs on a fallback's fit only: the alias asked for was checked by the client."""

    name = STAGE

    def enabled(self, policy: Policy) -> bool:
        return True  # a request the model would refuse is never better

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        if ex.deployment is None or ex.alias == ex.client.requested_alias or ex.dry_run:
            return None
        requested = ex.config.deployments.get(ex.client.requested_alias, ())
        missing = lacks(ex, ctx.catalog.facts(ex.deployment), requested)
        if not missing.anything:
            return None
        recall = ex.policy.recall.enabled and not missing.tools
        out = messages
        if missing.vision:
            out = await _parts(ex, ctx, out, IMAGES, "image", recall)
        if missing.documents:
            out = await _parts(ex, ctx, out, DOCUMENTS, "document", recall)
        drop_reasoning = False
        # Tool-call turns written as text no longer carry their reasoning: it goes too, stored.
        if missing.reasoning or missing.signatures or missing.tools:
            out, drop_reasoning = await _reasoning(ex, ctx, out, missing.reasoning)
        if missing.tools:
            out = await _tools(ex, ctx, out)
        limit = _clamp(ex, ctx, missing.max_output_tokens)
        renderer = ex.client.renderer
        if renderer is not None and (drop_reasoning or missing.reasoning or limit is not None):
            renderer.fit(NativeFit(drop_reasoning, missing.reasoning, limit))
        return out if out is not messages else None


# --- images and documents -------------------------------------------------------------------


async def _parts(
    ex: Exchange,
    ctx: StageContext,
    messages: list[Message],
    kinds: frozenset[str],
    what: str,
    recall: bool,
) -> list[Message]:
    """Each part of `kinds` archived and replaced by a marker naming its ref."""
    found: dict[int, list[int]] = {}
    entries = []
    for index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for at, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in kinds:
                found.setdefault(index, []).append(at)
                entries.append(entry(ex, what, orjson.dumps(part), role=message.get("role")))
    if not entries:
        return messages
    stored = await ctx.archive.keep(ex, STAGE, entries)
    out = list(messages)
    refs: list[str] = []
    pending = iter(entries)
    for index, places in found.items():
        content = list(messages[index]["content"])
        for at in places:
            ref = next(pending).ref
            if ref in stored:
                content[at] = {"type": "text", "text": marker(what, ex.alias, ref, recall)}
                refs.append(ref)
        out[index] = {**messages[index], "content": content}
    if not refs:
        return messages
    record(ex, ctx, STAGE, f"removed_{what}s", count=len(refs), refs=refs, model=ex.alias)
    return out


def marker(what: str, alias: str, ref: str, recall: bool) -> str:
    """What the model reads instead of the part. Pure: the same part, the same bytes."""
    if recall:
        how = f'call the {RECALL_TOOL} tool with {{"ref": "{ref}"}} to read it back'
    else:
        how = f"people can read it with GET {ARCHIVE_PATH}{ref}"
    return (
        f"[agentproxy] An {what} was here; the model now answering ({alias}) cannot take "
        f"{what}s, so it was archived as {ref}: {how}."
    )


# --- reasoning --------------------------------------------------------------------------------


async def _reasoning(
    ex: Exchange, ctx: StageContext, messages: list[Message], no_setting: bool
) -> tuple[list[Message], bool]:
    """The history's signed reasoning archived and left out (the view leaves out what it does
    not show: True then); without reasoning at all, the chat request's setting too."""
    native = ex.client.native
    if native is not None:
        items = native.reasoning()
        entries = [entry(ex, "reasoning", orjson.dumps(item)) for item in items]
        stored = await ctx.archive.keep(ex, STAGE, entries)
        if not entries or len(stored) < len({e.ref for e in entries}):
            return messages, False  # nothing there, or not all of it stored: all of it stays
        _noted(ex, ctx, [e.ref for e in entries])
        return messages, True
    if no_setting:
        for name in CHAT_REASONING_SETTINGS:
            if name in ex.body:
                _set(ex, name, None)
    carried = [
        (index, {k: m[k] for k in CHAT_REASONING if k in m})
        for index, m in enumerate(messages)
        if m.get("role") == "assistant" and any(k in m for k in CHAT_REASONING)
    ]
    if not carried:
        return messages, False
    entries = [entry(ex, "reasoning", orjson.dumps(fields)) for _, fields in carried]
    stored = await ctx.archive.keep(ex, STAGE, entries)
    out = list(messages)
    refs = []
    for (index, _), kept in zip(carried, entries, strict=True):
        if kept.ref in stored:
            out[index] = {k: v for k, v in messages[index].items() if k not in CHAT_REASONING}
            refs.append(kept.ref)
    if refs:
        _noted(ex, ctx, refs)
    return out, False


def _noted(ex: Exchange, ctx: StageContext, refs: list[str]) -> None:
    record(ex, ctx, STAGE, "removed_reasoning", count=len(refs), refs=refs, model=ex.alias)


# --- tools ------------------------------------------------------------------------------------


async def _tools(ex: Exchange, ctx: StageContext, messages: list[Message]) -> list[Message]:
    """No tools: the definitions archived and left out, past calls and results as text."""
    tools = ex.body.get("tools") or ex.body.get("functions")
    ref = None
    if tools:
        kept = entry(ex, "tools", orjson.dumps(tools), count=len(tools))
        if kept.ref not in await ctx.archive.keep(ex, STAGE, [kept]):
            return messages  # not stored: the request goes as it is (and may be refused)
        ref = kept.ref
    names = _call_names(messages)
    out: list[Message] = []
    written = 0
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            out.append(_calls_as_text(message))
            written += 1
        elif message.get("role") == "tool":
            out.append(_result_as_text(message, names))
            written += 1
        else:
            out.append(message)
    for name in TOOL_FIELDS:
        if name in ex.body:
            _set(ex, name, None)
    if not ref and not written:
        return messages
    fields: dict[str, Any] = {"count": written, "model": ex.alias}
    if ref:
        fields["ref"] = ref
    record(ex, ctx, STAGE, REMOVED_TOOLS, **fields)
    return out if written else messages


def _call_names(messages: list[Message]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            body, _ = call_body(call)
            if body is not None and isinstance(call.get("id"), str):
                names[call["id"]] = str(body.get("name"))
    return names


def _calls_as_text(message: Message) -> Message:
    lines = [text_of(message)] if text_of(message) else []
    for call in message.get("tool_calls") or []:
        body, key = call_body(call)
        if body is None:
            continue
        lines.append(
            f"[agentproxy] called tool {body.get('name')} (call {call.get('id')}) with "
            f"{body.get(key) or '{}'}"
        )
    return {"role": "assistant", "content": "\n".join(lines)}


def _result_as_text(message: Message, names: dict[str, str]) -> Message:
    call_id = message.get("tool_call_id")
    name = names.get(call_id, "a tool") if isinstance(call_id, str) else "a tool"
    head = f"[agentproxy] result of {name} (call {call_id}):"
    return {"role": "user", "content": f"{head}\n{text_of(message)}"}


# --- the output limit -------------------------------------------------------------------------


def _clamp(ex: Exchange, ctx: StageContext, limit: int | None) -> int | None:
    """The output limit the view must apply (None: none, or done here on a chat body)."""
    if limit is None:
        return None
    native = ex.client.native
    asked = (
        [ex.body.get(name) for name in CHAT_LIMITS] if native is None else [native.output_limit()]
    )
    over = [n for n in asked if isinstance(n, int) and not isinstance(n, bool) and n > limit]
    if not over:
        return None
    if native is None:
        for name in CHAT_LIMITS:
            value = ex.body.get(name)
            if isinstance(value, int) and value > limit:
                _set(ex, name, limit)
    record(ex, ctx, STAGE, "clamped_max_tokens", asked=max(over), to=limit, model=ex.alias)
    return limit if native is not None else None


def _set(ex: Exchange, name: str, value: Any) -> None:
    """A top-level field changed (None: taken out), as sent kept for `restore`."""
    ex.client.fields_sent.setdefault(name, (name in ex.body, ex.body.get(name)))
    if value is None:
        ex.body.pop(name, None)
    else:
        ex.body[name] = value
