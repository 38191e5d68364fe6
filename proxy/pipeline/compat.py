"""Compatibility shims per deployment: what one upstream server needs that others do not.

`content: null` on an assistant message (the openai SDK sends it back for a turn that only
called tools) is valid at OpenAI and most servers, but llama-cpp-python answers it with a 500
validation error, every time. A deployment that needs it gets `""` instead, when:

- its `model_info.supports_null_content` is false (declared), or
- it once answered a request holding a null content with an error that names it: learnt then,
  remembered for the deployment (its model and address, so a config reload keeps it) and
  used from the next call on. It is about the server, not anyone's data, so every tenant's
  requests to that deployment get it alike.

The stage runs right after repair, before anything is sent; the control loop's rejection hook
(Rewriter.after_rejection) learns a shim and re-sends the request once with it.
"""

from __future__ import annotations

from proxy.exchange import Exchange
from proxy.messages import Message
from proxy.pipeline.base import StageContext, record
from proxy.policies.spec import Deployment, Policy
from proxy.upstream import no_chat
from proxy.upstream.facts import DeploymentFacts, as_chat_note

STAGE = "compat"
NULL_CONTENT = "emptied_null_content"
SCAN_BYTES = 64 * 1024
# An error body blames a null content when it names the field and says what was wrong with it:
# pydantic's "Input should be a valid string" with "'input': None", a template's "NoneType".
_FIELD = "content"
_COMPLAINTS = ("none", "null", "valid string", "string_type")


def complains_of_null_content(body: bytes) -> bool:
    text = body[:SCAN_BYTES].decode("utf-8", "replace").lower()
    return _FIELD in text and any(word in text for word in _COMPLAINTS)


def has_null_content(messages: list[Message]) -> bool:
    return any(m.get("role") == "assistant" and _null_content(m) for m in messages)


def empty_null_contents(messages: list[Message]) -> tuple[list[Message], int]:
    """A copy with `""` for every assistant message's null content (other dicts reused), and
    how many were changed."""
    out: list[Message] = []
    changed = 0
    for message in messages:
        if message.get("role") == "assistant" and _null_content(message):
            message = {**message, "content": ""}
            changed += 1
        out.append(message)
    return out, changed


def _null_content(message: Message) -> bool:
    return "content" in message and message["content"] is None


class Quirks:
    """Which deployments need which shim: declared in their model_info, or learnt from a
    rejection. Bounded: deployments of configs long replaced fall out."""

    def __init__(self, facts: DeploymentFacts | None = None) -> None:
        self.facts = facts if facts is not None else DeploymentFacts()  # the app's
        self._no_null_content = self.facts.no_null_content

    def needs_empty_content(self, deployment: Deployment) -> bool:
        declared = deployment.supports_null_content
        if declared is not None:
            return not declared
        if not self._no_null_content:  # the common case: nothing learnt at all
            return False
        return (deployment.model, deployment.api_base) in self._no_null_content

    def learn(self, deployment: Deployment, body: bytes, messages: list[Message]) -> bool:
        """After a rejection: True when `deployment` needs null contents emptied and `messages`
        have one (learnt now if it was not known: the error named the field)."""
        if deployment.supports_null_content is True or not has_null_content(messages):
            return False
        if self.needs_empty_content(deployment):
            return True  # known already (a retry reached it with a body fitted elsewhere)
        if not complains_of_null_content(body):
            return False
        self.facts.learn_no_null_content(deployment)
        return True


class CompatStage:
    """Applies the shims the request's deployment needs. Not a policy choice: a request the
    deployment would refuse is never better, so it runs under every policy."""

    name = STAGE
    preserves_pairing = True  # only contents change

    def __init__(self, quirks: Quirks) -> None:
        self.quirks = quirks

    def enabled(self, policy: Policy) -> bool:
        return True

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        deployment = ex.deployment
        if deployment is None:
            return None
        if self.quirks.facts.lacks_native_route(ex.client.wire, deployment):
            # Visible on every request it translates (a Responses client's: responses_as_chat).
            record(ex, ctx, STAGE, as_chat_note(ex.client.wire))
        alternate = ex.client.alternate
        if alternate is not None and alternate.applies(deployment):
            record(ex, ctx, STAGE, no_chat.NOTE)  # a chat request sent in another wire
        if not self.quirks.needs_empty_content(deployment):
            return None
        return adapt(ex, ctx, messages)


def adapt(ex: Exchange, ctx: StageContext, messages: list[Message]) -> list[Message] | None:
    """`messages` with null contents emptied (noted), or None when there were none."""
    out, changed = empty_null_contents(messages)
    if not changed:
        return None
    record(ex, ctx, STAGE, NULL_CONTENT, count=changed)
    return out
