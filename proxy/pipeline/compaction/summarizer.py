"""The summarizer: one non-streaming call that turns a stretch of history into a structured
summary (SESSION INTENT, SUMMARY, ARTIFACTS, NEXT STEPS; sections.py), in the wire format the
summarizer's deployment takes (summary_wire.py: Responses to a Responses-only server, Anthropic
Messages to an Anthropic model, chat to the rest).

The call goes through control like any other (retries, fallbacks, deployment circuits, the
request's deadline) as a child exchange of the request, and what it used is charged to the
request: to its budgets, and to the token and cost metrics under the summarizer's model.

Intent and next steps are what keep an agent on task after compaction (deepagents' lesson);
artifacts keep it from redoing work. The request is fitted to the summarizer model's own
window: its output is bounded (max_tokens: the room the summary has in the target's window, at
most a quarter of the summarizer's), and the transcript gets what is left of the window after
the instructions and that output, each message and the whole capped, the middle cut first.
Token counts are the proxy's estimates (proxy.messages), so a "context exceeded" answer is
retried once with half the transcript.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

import orjson

from proxy import messages as msgs
from proxy.exchange import ClientRequest, Exchange, Timing
from proxy.messages import Message, text_of
from proxy.metrics import Metrics
from proxy.model_catalog import ModelCatalog
from proxy.pipeline.base import Summarizer
from proxy.pipeline.compaction.sections import SECTIONS
from proxy.pipeline.compaction.summary_wire import SummaryView, SummaryWires, send_in
from proxy.policies.spec import Deployment, Policy
from proxy.tracing import span as trace_span
from proxy.upstream.base import UpstreamHTTPError
from proxy.upstream.overflow import is_context_overflow

__all__ = ["SECTIONS", "SYSTEM_PROMPT", "make_summarizer"]

SYSTEM_PROMPT = """\
You summarize the earlier part of a conversation between a user and an AI agent. The agent will \
continue the task with only your summary and the most recent messages, so keep everything it \
needs and nothing else. The full transcript stays archived; refer to it, do not copy it.

Answer with exactly these four sections, in this order, each heading on its own line:

SESSION INTENT:
The user's goal, in the user's own words where possible, with every requirement and \
constraint they stated. If the transcript starts with an earlier summary, carry its SESSION \
INTENT forward unchanged and add what the user asked for since.

SUMMARY:
What has been done and learned so far: decisions and their reasons, results, errors and how \
they were resolved, anything the user corrected.

ARTIFACTS:
Every file, path, URL, identifier and archive reference (ap_...) created, read or changed, one \
per line, with a few words on what it is.

NEXT STEPS:
What remains to do to reach the user's goal, in order, starting with what the agent was doing \
when the transcript ends."""

MESSAGE_CHARS = 3_000  # per message in the transcript, at most
MIN_MESSAGE_CHARS = 300  # ...and at least: a tighter transcript shows fewer messages
TRANSCRIPT_CHARS = 200_000  # the whole transcript, unless the summarizer's window is smaller
MIN_TRANSCRIPT_CHARS = 1_000
SUMMARY_MAX_TOKENS = 2_048  # the longest summary asked for, whatever the windows
MIN_OUTPUT_TOKENS = 64
OUTPUT_WINDOW_SHARE = 0.25  # of the summarizer's window its answer may take
WINDOW_MARGIN = 0.1  # of the transcript's budget left unused: the estimates are rough
# OpenAI's own API counts reasoning within max_completion_tokens: room for it on top.
REASONING_ALLOWANCE = 4_096
OPENAI_API = "https://api.openai.com/v1"


class SummarizerError(Exception):
    """The summarizer's answer had no usable text."""


class Caller(Protocol):
    """Control as the summarizer uses it: fallback ⊃ retry ⊃ circuit ⊃ upstream call."""

    async def route(self, ex: Exchange) -> None: ...

    async def call(self, ex: Exchange, *, stream: bool) -> Any: ...


def make_summarizer(
    control: Caller,
    metrics: Metrics,
    catalog: ModelCatalog | None = None,
    wires: SummaryWires | None = None,
) -> Summarizer:
    """A Summarizer calling the policy's summarizer model (or the request's own model) through
    control, in the wire its deployment takes (`wires`: the app's, from the registry; none:
    chat), charged to the request; every call timed and counted by result."""
    wires = wires or SummaryWires()

    async def summarize(ex: Exchange, messages: list[Message], room: int) -> str:
        started = time.perf_counter()
        result = "failed"
        try:
            with trace_span("agentproxy.summary", {"agentproxy.messages": len(messages)}):
                summary = await _summarize(ex, messages, room)
            result = "ok"
            return summary
        finally:
            elapsed = time.perf_counter() - started
            metrics.child(metrics.summarizer_duration, result).observe(elapsed)

    async def _summarize(ex: Exchange, messages: list[Message], room: int) -> str:
        fit: Fit | None = None
        halved = learnt = False
        while True:
            child = summary_exchange(ex)
            if child.deployment is None:
                await control.route(child)  # the session's deployment, open circuits skipped
            deployment = child.deployment
            assert deployment is not None
            if fit is None:
                fit = fit_to(window_of(deployment, catalog), room)
            system, user = summary_prompt(messages, fit)
            child.body = chat_request(deployment, system, user, fit.max_tokens)
            view: SummaryView | None = None
            wire = wires.choose(ex.client.wire, deployment)
            if wire is not None:
                native = wire.one_shot.request(deployment, system, user, fit.max_tokens)
                view = send_in(child, wire, native)
            sent_body = child.body if view is None else view.native
            child.client.body_bytes = len(orjson.dumps(sent_body))  # what an unreported usage costs
            try:
                reply = await control.call(child, stream=False)  # no fitter: sent as built
            except UpstreamHTTPError as error:
                if not learnt and lacks_chat(wires, child, view, error):
                    learnt = True  # once more, in a wire the deployment speaks
                    continue
                sent = len(user)
                overflowed = is_context_overflow(error.status, error.body)
                if halved or not overflowed or sent <= MIN_TRANSCRIPT_CHARS:
                    raise
                fit = fit.smaller(sent)  # our estimate was low for this model: once, half
                halved = True
                continue
            finally:
                ex.add_side_call(child)  # charged to the request whatever happened
            return answer_text(view, reply.data)

    return summarize


def lacks_chat(
    wires: SummaryWires, child: Exchange, view: SummaryView | None, error: UpstreamHTTPError
) -> bool:
    """A summary sent as chat met a server with no chat route (Responses only) that another
    wire speaks: learnt, so the next try (and every later summary) goes in that one."""
    tried = child.deployment
    if tried is None or (view is not None and view.sent_native):
        return False
    return wires.learn_no_chat(tried, error.status, error.body)


def summary_exchange(ex: Exchange) -> Exchange:
    """The summary request as an exchange of its own: the request's owner, session, key and
    deadline, its policy's retries, fallbacks and circuits, but neither compaction (the
    transcript is bounded already; a summary must not summon another) nor recall. Its body is
    the caller's to set."""
    alias = ex.policy.compaction.summarizer_model
    deployment = None
    if alias is None:
        if ex.deployment is None:
            raise LookupError("no deployment chosen for this request yet")
        alias, deployment = ex.alias, ex.deployment
    elif not ex.config.deployments.get(alias):
        raise LookupError(f"summarizer_model {alias!r} is not a configured model alias")
    child = Exchange(
        # The request's tenant and session, in a record of its own (as given: not re-admitted).
        identity=replace(ex.identity, session_given=True),
        config=ex.config,
        body={},
        alias=alias,
        policy=_for_summaries(ex.policy),
        client=ClientRequest(route=ex.client.route),
        deployment=deployment,
        timing=Timing(started=ex.timing.started),  # the request's deadline covers its summaries
    )
    child.recovery.deadline = ex.recovery.deadline
    return child


def _for_summaries(policy: Policy) -> Policy:
    return replace(
        policy,
        compaction=replace(policy.compaction, enabled=False),
        recall=replace(policy.recall, enabled=False),
    )


def window_of(deployment: Deployment, catalog: ModelCatalog | None) -> int | None:
    return catalog.facts(deployment).max_input_tokens if catalog else deployment.max_input_tokens


class Fit:
    """How much transcript goes in and how much summary may come out."""

    __slots__ = ("max_tokens", "transcript_chars")

    def __init__(self, transcript_chars: int, max_tokens: int) -> None:
        self.transcript_chars = transcript_chars
        self.max_tokens = max_tokens

    def smaller(self, sent: int) -> Fit:
        """Half of what was sent (`sent` characters of transcript, maybe less than allowed)."""
        half = min(self.transcript_chars, sent) // 2
        return Fit(max(MIN_TRANSCRIPT_CHARS, half), self.max_tokens)


INSTRUCTION_TOKENS = (
    msgs.TOKENS_PER_MESSAGE * 2 + int(len(SYSTEM_PROMPT) / msgs.CHARS_PER_TOKEN) + 40
)


def fit_to(window: int | None, room: int) -> Fit:
    """The request for a summarizer whose window is `window` tokens (None: unknown), for a
    summary of at most `room` tokens."""
    output = max(MIN_OUTPUT_TOKENS, min(room, SUMMARY_MAX_TOKENS))
    if not window:
        return Fit(TRANSCRIPT_CHARS, output)
    output = max(MIN_OUTPUT_TOKENS, min(output, int(OUTPUT_WINDOW_SHARE * window)))
    # The system prompt, the user message's own overhead and its closing instruction.
    instructions = msgs.estimate_tokens({"content": SYSTEM_PROMPT}) + msgs.TOKENS_PER_MESSAGE + 30
    budget = (window - output - instructions) * (1 - WINDOW_MARGIN)
    chars = int(budget * msgs.CHARS_PER_TOKEN)
    return Fit(max(MIN_TRANSCRIPT_CHARS, min(TRANSCRIPT_CHARS, chars)), output)


def summary_request(
    deployment: Deployment, messages: Sequence[Message], fit: Fit
) -> dict[str, Any]:
    """The summary request, chat-shaped."""
    system, user = summary_prompt(messages, fit)
    return chat_request(deployment, system, user, fit.max_tokens)


def summary_prompt(messages: Sequence[Message], fit: Fit) -> tuple[str, str]:
    """The instructions and the transcript to summarize, fitted."""
    limit = fit.transcript_chars
    per_message = max(MIN_MESSAGE_CHARS, min(MESSAGE_CHARS, limit // 4))
    transcript = render_transcript(messages, per_message, limit)
    words = max(30, int(fit.max_tokens * 0.6))  # a word is ~1.3 tokens; leave some slack
    ask = f"Transcript to summarize (answer with the four sections, in at most {words} words):"
    return SYSTEM_PROMPT, f"{ask}\n\n{transcript}"


def chat_request(deployment: Deployment, system: str, user: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": deployment.alias,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "stream": False,
        **output_limit(deployment, max_tokens),
    }


def output_limit(deployment: Deployment, tokens: int) -> dict[str, int]:
    """`max_tokens`, which every OpenAI-compatible server and litellm know, except at OpenAI's
    own API: its reasoning models refuse it and want `max_completion_tokens`, reasoning
    included (so it gets room for that too)."""
    if deployment.provider == "openai" and deployment.base_url == OPENAI_API:
        return {"max_completion_tokens": tokens + REASONING_ALLOWANCE}
    return {"max_tokens": tokens}


def render_transcript(messages: Sequence[Message], message_chars: int, limit: int) -> str:
    """One block per message, headed `[#n role]`; long texts keep their start and end."""
    blocks = [_block(n, m, message_chars) for n, m in enumerate(messages, 1)]
    text = "\n\n".join(blocks)
    if len(text) <= limit:
        return text
    half = limit // 2
    dropped = len(text) - 2 * half
    return f"{text[:half]}\n\n[… {dropped} chars of the transcript left out …]\n\n{text[-half:]}"


def _block(number: int, message: Message, chars: int) -> str:
    role = str(message.get("role", "unknown"))
    header = f"[#{number} {role}]"
    if role == "tool":
        header = f"[#{number} tool result for {message.get('tool_call_id', '?')}]"
    lines = [header]
    content = message.get("content")
    if content:
        lines.append(_cap(text_of({"content": content}), chars))
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            arguments = function.get("arguments", "")
            if not isinstance(arguments, str):
                arguments = orjson.dumps(arguments).decode()
            name = function.get("name", "?")
            lines.append(f"→ calls {name} ({call.get('id', '?')}): {_cap(arguments, chars)}")
    return "\n".join(lines)


def _cap(text: str, chars: int) -> str:
    if len(text) <= chars:
        return text
    half = chars // 2
    return f"{text[:half]} […{len(text) - 2 * half} chars…] {text[-half:]}"


def answer_text(view: SummaryView | None, data: dict[str, Any]) -> str:
    """The summary, from an answer in the shape its request went in."""
    if view is None or not view.sent_native:
        return summary_text(data)
    text = view.wire.one_shot.text(data)
    if not text or not text.strip():
        raise SummarizerError("the summarizer's answer has no text")
    return text.strip()


def summary_text(data: dict[str, Any]) -> str:
    try:
        content = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise SummarizerError("the summarizer's answer has no message") from None
    if not isinstance(content, str) or not content.strip():
        raise SummarizerError("the summarizer's answer is empty")
    return content.strip()
