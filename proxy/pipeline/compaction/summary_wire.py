"""Which wire format a summary request goes in: the one the deployment takes.

A summary is built chat-shaped (the child exchange's body, what a translation starts from) and,
for a deployment some wire's native upstream speaks, rendered in that wire by its `OneShot`
(proxy/wire/<format>/one_shot.py) through a small RequestView, so control sends it as it sends
a client's request of that wire. The choice, per deployment:

1. the request's own wire, when its native upstream speaks the deployment (a Codex session on
   a Responses deployment: Responses; Claude Code on an Anthropic one: Messages);
2. chat, on the fast path (an OpenAI-compatible server), unless the deployment was learnt to
   serve no chat completions (its 404 on the route: proxy/upstream/no_chat.py);
3. else a wire whose native upstream speaks it (an `anthropic/` deployment: Messages, natively,
   with no litellm), else chat (litellm's translation).

The app hands the summarizer the registry's wires with their native upstreams' `speaks`; this
module names none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.exchange import Exchange, NativeFit, NativePrefix, OneShot
from proxy.policies.spec import Deployment
from proxy.upstream.facts import DeploymentFacts


@dataclass(frozen=True, slots=True)
class SummaryWire:
    """A wire a summary can go in: its name, how it writes one, and whether its native upstream
    speaks a deployment."""

    name: str
    one_shot: OneShot
    speaks: Callable[[Deployment], bool]


class SummaryWires:
    def __init__(
        self, wires: Sequence[SummaryWire] = (), facts: DeploymentFacts | None = None
    ) -> None:
        self.wires = {wire.name: wire for wire in wires}
        self.facts = facts if facts is not None else DeploymentFacts()  # the app's

    def choose(self, parent: str, deployment: Deployment) -> SummaryWire | None:
        """The wire to send a summary to `deployment` in, for a request of wire `parent`;
        None: chat."""
        own = self.wires.get(parent)
        if own is not None and own.speaks(deployment):
            return own
        if deployment.fast_path and not self.facts.no_chat.lacked_by(deployment):
            return None
        return next((w for w in self.wires.values() if w.speaks(deployment)), None)

    def learn_no_chat(self, deployment: Deployment, status: int, body: bytes) -> bool:
        """A chat summary's error: True when it says the deployment serves no chat and another
        wire speaks to it (the next summary goes in that one)."""
        if not any(w.speaks(deployment) for w in self.wires.values()):
            return False
        return self.facts.no_chat.learn(deployment, status, body)


class SummaryView:
    """The summary request of a child exchange in `wire`: its native body to a deployment that
    wire's upstream speaks, the chat body (translated by the shared transports) to any other a
    fallback reaches. Remembers which it sent last, to read the answer in that shape."""

    __slots__ = ("native", "sent_native", "wire")

    def __init__(self, wire: SummaryWire, native: dict[str, Any]) -> None:
        self.wire = wire
        self.native = native
        self.sent_native = False

    def native_for(self, deployment: Deployment) -> bool:
        return self.wire.speaks(deployment)

    def render(self, chat: dict[str, Any]) -> dict[str, Any]:
        self.sent_native = True
        return self.native

    def translated(self, chat: dict[str, Any]) -> dict[str, Any]:
        self.sent_native = False
        return chat

    # A summary is sent as built (no fitter re-fits it on fallback): no reasoning to drop, no
    # limit but the one it was built with.
    def reasoning(self) -> list[dict[str, Any]]:
        return []

    def output_limit(self) -> int | None:
        return None

    def fit(self, fit: NativeFit) -> None:
        pass

    def native_prefix(self) -> NativePrefix:
        return NativePrefix("")  # a turn of its own: nothing taken from an earlier one


def send_in(child: Exchange, wire: SummaryWire, native: dict[str, Any]) -> SummaryView:
    """Make `child` (its body the chat-shaped summary request) a request of `wire`."""
    view = SummaryView(wire, native)
    child.client.wire = wire.name
    child.client.renderer = child.client.native = view
    child.client.forward_headers = dict(wire.one_shot.headers)
    return view
