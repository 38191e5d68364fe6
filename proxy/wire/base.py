"""The Wire interface: what the app, the HTTP shell and the upstream pool know of a wire format,
without naming one. A format is a folder under proxy/wire/ (its route, request view, replies,
stream relay, native upstream) whose wire.py offers one `Wire`, listed in proxy/wire/registry.py.

Per request, a format's route gives the flow two more small objects: a `RequestView`
(proxy/exchange.py: its native body, rendered from the rewritten chat view or translated) and
its `Answers` (proxy/wire/serve.py: a reply, a stream, a provider's error, a degraded answer).
Across turns, a format whose view lends the next turn's keeps a small record of each turn
(its memory.py), in the session's TurnMemory (proxy/sessions/turn_memory.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from proxy.errors import ProxyError
from proxy.exchange import OneShot, Usage
from proxy.http.auth import KeyPlaces
from proxy.policies.spec import Config
from proxy.recording.answers import AnswerAssembly, Assemble
from proxy.recording.conversation import Conversation
from proxy.upstream.pool import NativeFactory

ErrorBody = Callable[[ProxyError, str | None], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ModelList:
    """How a wire lists the models a key may use: where (GET `paths`, which other wires may
    list at too: proxy/wire/models.py picks one per request), whether a listing request is in
    its manner (None: it answers any request no other wire's manner claims), and the list."""

    paths: tuple[str, ...]
    render: Callable[[Config, list[str]], Mapping[str, Any]]  # the aliases, in config order
    in_manner: Callable[[web.Request], bool] | None = None


class Wire(Protocol):
    """One wire format."""

    @property
    def name(self) -> str:
        """Its name: a metric label and the key of its native upstream."""
        ...

    @property
    def routes(self) -> web.RouteTableDef:
        """Its HTTP routes (parse, open the Exchange, hand it to the flow)."""
        ...

    @property
    def model_route(self) -> str | None:
        """The path of its model route: a recorded turn of this wire is replayed there, the
        turn's model in place of `{model}` when the path names it (None: not replayed)."""
        ...

    @property
    def paths(self) -> tuple[str, ...]:
        """Path prefixes it owns beyond its routes' own: a path no route matched under one
        gets its error envelope."""
        ...

    @property
    def provider(self) -> str:
        """The provider whose deployments speak this wire (a replayed trace's models are
        deployments of it)."""
        ...

    @property
    def native(self) -> NativeFactory | None:
        """The upstream that serves its clients natively, on the deployments it speaks to
        (any other deployment gets the request translated to chat)."""
        ...

    def error_body(self, error: ProxyError, request_id: str | None) -> Mapping[str, Any]:
        """A proxy error in this wire's envelope."""
        ...

    def usage(self, usage: Any) -> Usage | None:
        """A usage object as this wire's replies and events report it."""
        ...

    def reply_usage(self, reply: Mapping[str, Any]) -> Usage | None:
        """The usage a whole (non-streamed) reply of this wire reports."""
        ...

    def answer_assembly(self) -> AnswerAssembly:
        """A fresh assembly of one streamed answer into its non-streamed form (recordings)."""
        ...

    def replay_headers(self, request: Mapping[str, Any]) -> dict[str, str]:
        """The protocol headers a recorded request answered live must have come with, for a
        recording that kept none (made before recordings kept them): replay sends these."""
        ...

    @property
    def conversation(self) -> Conversation:
        """How its bodies read as a conversation: a request's new messages, an answer's text,
        tool calls and stop reason, an error envelope's message (the inspector's timeline)."""
        ...

    @property
    def extra_natives(self) -> tuple[NativeFactory, ...]:
        """More native upstreams of its own, each under its own wire name (another route of
        the same format: Responses' /responses/compact)."""
        ...

    @property
    def one_shot(self) -> OneShot | None:
        """How the proxy's own requests (summaries) are written in this wire, for deployments
        its native upstream speaks to; None: chat, the shape they are built in."""
        ...

    @property
    def key_headers(self) -> tuple[str, ...]:
        """Headers its clients present their key in, beyond `Authorization: Bearer`."""
        ...

    @property
    def key_query(self) -> str | None:
        """A query parameter its clients may present their key in (never logged)."""
        ...

    @property
    def model_list(self) -> ModelList | None:
        """How its clients list the models (None: it has no list of its own)."""
        ...


@dataclass(frozen=True, slots=True)
class WireFormat:
    """A `Wire` from its parts (each format's wire.py makes one)."""

    name: str
    routes: web.RouteTableDef
    model_route: str | None
    provider: str
    assembly: Assemble
    conversation: Conversation
    native: NativeFactory | None = None
    paths: tuple[str, ...] = ()
    error_shape: ErrorBody | None = None  # None: OpenAI's envelope
    usage_of: Callable[[Any], Usage | None] = Usage.of
    usage_key: str = "usage"  # where a whole reply holds its usage
    one_shot: OneShot | None = None
    extra_natives: tuple[NativeFactory, ...] = ()
    model_list: ModelList | None = None
    key_headers: tuple[str, ...] = ()
    key_query: str | None = None
    implied_headers: Callable[[Mapping[str, Any]], dict[str, str]] | None = None

    def error_body(self, error: ProxyError, request_id: str | None) -> Mapping[str, Any]:
        if self.error_shape is None:
            return error.body(request_id)
        return self.error_shape(error, request_id)

    def usage(self, usage: Any) -> Usage | None:
        return self.usage_of(usage)

    def reply_usage(self, reply: Mapping[str, Any]) -> Usage | None:
        return self.usage_of(reply.get(self.usage_key))

    def replay_headers(self, request: Mapping[str, Any]) -> dict[str, str]:
        return {} if self.implied_headers is None else self.implied_headers(request)

    def answer_assembly(self) -> AnswerAssembly:
        return self.assembly()


def key_places(wires: tuple[Wire, ...]) -> KeyPlaces:
    """Every place a wire's clients present their key in, for authentication (http/auth.py),
    which names no wire: in the registry's order."""
    return KeyPlaces(
        headers=tuple(dict.fromkeys(h for wire in wires for h in wire.key_headers)),
        queries=tuple(dict.fromkeys(w.key_query for w in wires if w.key_query is not None)),
    )


class ErrorFrames:
    """Which wire frames a proxy error: the one whose route the request matched (`matched`,
    the route's path as declared); for a path no route matched (a 404, a request head that
    never completed), the wire owning the longest prefix of it (a route's path up to its
    first variable, or one of the wire's `paths`); else OpenAI's envelope. Made once per app
    from the registry (the middleware's ERROR_BODY)."""

    def __init__(self, wires: tuple[Wire, ...]) -> None:
        self._by_route: dict[str, Wire] = {}
        owned: dict[str, Wire] = {}
        for wire in wires:
            for route in wire.routes:
                if isinstance(route, web.RouteDef):  # by its path as a match names it
                    self._by_route.setdefault(_canonical(route.path), wire)
                    owned.setdefault(route.path.partition("{")[0], wire)
            for path in wire.paths:
                owned.setdefault(path, wire)
        for wire in wires:  # a list shared by several (models.py): the first listed frames it
            for path in wire.model_list.paths if wire.model_list is not None else ():
                self._by_route.setdefault(path, wire)
        # Longest first: a path under /v1/messages/ is Anthropic's before it is anyone's.
        self._prefixes = sorted(owned.items(), key=lambda item: -len(item[0]))

    def __call__(
        self, matched: str | None, path: str, error: ProxyError, request_id: str | None
    ) -> Mapping[str, Any]:
        wire = self._by_route.get(matched) if matched is not None else self._extended(path)
        return error.body(request_id) if wire is None else wire.error_body(error, request_id)

    def _extended(self, path: str) -> Wire | None:
        return next((wire for route, wire in self._prefixes if path.startswith(route)), None)


def _canonical(path: str) -> str:
    """A route's path as its matched resource gives it: variables without their patterns."""
    return web.DynamicResource(path).canonical if "{" in path else path
