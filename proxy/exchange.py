"""The Exchange: one object per request, passed through every stage of the pipeline."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from proxy.messages import CHAT, TOKENS_PER_MESSAGE
from proxy.policies.spec import ApiKey, Config, Deployment, ErrorClass, Policy

if TYPE_CHECKING:  # the view's module uses the pipeline, which uses the Exchange
    from proxy.sessions.history_memo import Checked


@dataclass(slots=True)
class Usage:
    """Tokens one or more calls used. `cache_read` and `cache_write` are the parts of the
    prompt read from and written to the provider's prompt cache (priced at their own rates)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0

    @classmethod
    def of(cls, usage: Any) -> Usage | None:
        """A Chat Completions reply's usage (prompt_tokens, prompt_tokens_details.cached_tokens),
        the shape every shared transport answers in; each other wire reads its own
        (proxy/wire/<format>/upstream.py)."""
        if not isinstance(usage, dict):
            return None
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return None
        return cls(prompt, completion, cached_tokens(usage.get("prompt_tokens_details")))

    @property
    def uncached(self) -> int:
        return max(0, self.prompt_tokens - self.cache_read - self.cache_write)

    def described(self) -> dict[str, int]:
        """As a recorded turn and the sessions routes give it (prompt includes cached)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cache_read,
        }

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cache_read += other.cache_read
        self.cache_write += other.cache_write


def cached_tokens(details: Any) -> int:
    """`cached_tokens` of a usage's details object, when it holds a count."""
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and cached > 0 else 0


@dataclass(slots=True)
class PromptMeasure:
    """The prompt size a decision was made on (proxy/pipeline/meter.py): `total` in the
    measure's units (estimates, or the model's tokenizer when `exact`), of which each of the
    `messages` framed takes a fixed few; the rest scaled by `ratio` (the session's calibration
    against the provider's counts) gives provider tokens."""

    model: str  # the deployment's model it was measured for
    total: int  # of what is sent: set again when compaction changes the history
    messages: int
    ratio: float = 1.0
    exact: bool = False
    density: float = 1.0  # exact: counted tokens per estimated token of the text (framing aside)

    @property
    def framing(self) -> int:
        return min(self.total, TOKENS_PER_MESSAGE * self.messages)

    @property
    def estimate(self) -> int:
        return int(self.framing + self.ratio * (self.total - self.framing) + 0.5)

    @property
    def factor(self) -> float:
        """Provider tokens per unit of the measure, for this request."""
        return self.estimate / self.total if self.total > 0 else 1.0

    def sent(self, total: int, messages: int) -> None:
        """Compaction changed what is sent: measure that."""
        self.total, self.messages = total, messages


@dataclass(slots=True)
class Timing:
    """Where a request's time went: waiting on the upstream and on the client; the rest is
    the proxy's own overhead."""

    started: float = field(default_factory=time.perf_counter)
    upstream_wait: float = 0.0
    client_wait: float = 0.0
    # When a streamed answer's first piece came from the upstream (perf_counter), if it did.
    first_token: float | None = None


@dataclass(slots=True)
class Accounting:
    """What a request used and cost: its own calls' usage (what its client is told), its
    side calls (summaries, each at its own model), and the cost of it all once charged."""

    usage: Usage | None = None
    cost_usd: float | None = None
    usage_reports: int = 0  # upstream calls whose usage was added (recall rounds: several)
    usage_estimated: bool = False  # some of it never reported: estimated instead
    side_calls: list[Charge] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Charge:
    """What the proxy's own calls for a request (a summary) used, on the deployment that
    served them: charged to the request, priced and counted as that model."""

    alias: str
    deployment: Deployment | None
    usage: Usage


@dataclass(slots=True)
class Note:
    """One rewrite or policy decision, reported in headers, metrics and the event log."""

    stage: str
    action: str
    fields: dict[str, Any] = field(default_factory=dict)  # counts, tokens before/after, refs


@dataclass(slots=True)
class Recovery:
    """What the control stages did for one request: the upstream calls made and the recoveries
    tried, in order, for error bodies, notes and metrics."""

    calls: int = 0  # upstream calls made, for every alias tried
    steps: list[str] = field(default_factory=list)  # "retry", "fallback to X", "compaction"
    last_status: int | None = None  # HTTP status of the last failed upstream call
    last_class: ErrorClass | None = None  # class of the last failure
    # The last overflow as the provider stated it, in its tokens: (prompt, window), each None
    # when its error does not say (compaction learns the session's window from it).
    overflow: tuple[int | None, int | None] = (None, None)
    deadline: float | None = None  # when retry.deadline_s runs out, on the control's clock
    guidance: str | None = None  # why recovery stopped, when that is worth saying
    session_failing: bool = False  # the session's circuit had failures when the request came
    downgrades: list[str] = field(default_factory=list)  # budgets that moved it (on_exhausted)

    def recoveries(self) -> list[str]:
        """The steps, consecutive retries counted: ["retry x2", "fallback to b", "compaction"]."""
        out: list[str] = []
        run = 0
        for step in [*self.steps, ""]:
            if step == "retry":
                run += 1
                continue
            if run:
                out.append(f"retry x{run}")
                run = 0
            if step:
                out.append(step)
        return out


@dataclass(frozen=True, slots=True)
class NativeFit:
    """What a fallback model cannot take of the parts of a request the chat-shaped view does
    not show (proxy/pipeline/capabilities.py): the view leaves them out when it renders. The
    default is the request as sent."""

    drop_reasoning: bool = False  # the history's signed reasoning (thinking, reasoning items)
    drop_reasoning_setting: bool = False  # the request's own (thinking, reasoning)
    max_output_tokens: int | None = None  # the most output the request may ask for


@dataclass(frozen=True, slots=True)
class NativePrefix:
    """How a native request's history list (`key`: "messages", "input") starts, as its view
    found it: `turn` names this request (an opaque token, holding nothing), `base` the turn
    of the session's view it was compared with (None: none), whose list's first `shared`
    entries this one's repeats (`==`). The recording hashes only the rest when it recorded
    that very turn."""

    key: str
    turn: object = field(default_factory=object)
    base: object | None = None
    shared: int = 0


class Renderer(Protocol):
    """What renders the outgoing request of a client in a wire format other than chat, from
    its rewritten chat-shaped view (the Exchange's `body`): in its own wire for a deployment
    that speaks it, else translated to chat."""

    def native_for(self, deployment: Deployment) -> bool:
        """Whether the deployment takes the client's own wire (its native upstream speaks)."""
        ...

    def render(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The native request, the view's rewrites carried back into it."""
        ...

    def translated(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The chat request, for a deployment that does not take the client's wire."""
        ...

    def fit(self, fit: NativeFit) -> None:
        """Render from now on without what `fit` takes away."""
        ...


class NativeRequest(Protocol):
    """What reads a client's request as it sent it in its own wire: what its chat-shaped view
    does not show."""

    def reasoning(self) -> list[dict[str, Any]]:
        """The history's signed reasoning (thinking blocks, reasoning items), as sent."""
        ...

    def output_limit(self) -> int | None:
        """The most output tokens the client asked for, if it said."""
        ...

    def native_prefix(self) -> NativePrefix:
        """Which leading entries of the native history equal the previous turn's."""
        ...


class RequestView(Renderer, NativeRequest, Protocol):
    """Both, as one object: each wire's view (proxy/wire/<format>/view.py) is the renderer
    and the reader of its requests."""


class AlternateWire(Protocol):
    """Another wire a chat client's request goes out in, to a deployment that serves no chat
    (learnt: proxy/upstream/no_chat.py); the chat wire's route gives one
    (proxy/wire/chat_as_responses.py)."""

    @property
    def wire(self) -> str:
        """The wire whose native upstream then sends it."""
        ...

    def reaches(self, deployment: Deployment) -> bool:
        """Whether that wire's native upstream speaks to the deployment (its chat aside)."""
        ...

    def applies(self, deployment: Deployment) -> bool:
        """Whether the request goes in that wire: learnt to serve no chat, and reached."""
        ...

    def render(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The chat request in that wire."""
        ...


class OneShot(Protocol):
    """A request the proxy makes on its own (a summary) in one wire format other than chat:
    built from a system text, a user text and an output limit, its answer read back as text.
    Each such wire offers one (proxy/wire/<format>/one_shot.py)."""

    @property
    def headers(self) -> dict[str, str]:
        """The protocol headers the request needs (anthropic-version)."""
        ...

    def request(
        self, deployment: Deployment, system: str, user: str, max_tokens: int
    ) -> dict[str, Any]: ...

    def text(self, data: dict[str, Any]) -> str | None:
        """The answer's text; None when it has none."""
        ...


@dataclass(frozen=True, slots=True)
class ClearToolUses:
    """Clear old tool results (and, if asked, their calls' inputs) once the prompt passes the
    trigger, the most recent `keep` tool uses left as they are (Anthropic's
    clear_tool_uses_20250919; its defaults)."""

    trigger: tuple[str, int] = ("input_tokens", 100_000)  # ("input_tokens" | "tool_uses", n)
    keep: int = 3  # the most recent tool uses kept
    clear_at_least: int = 0  # clear only when at least this many tokens go
    exclude_tools: frozenset[str] = frozenset()  # tools whose uses are never cleared
    clear_inputs: bool | frozenset[str] = False  # also the calls' inputs: all, or these tools'


@dataclass(frozen=True, slots=True)
class ClearThinking:
    """Drop the reasoning of all but the last `keep` assistant turns (None: keep all)."""

    keep: int | None = 1


@dataclass(frozen=True, slots=True)
class Compact:
    """Summarize the history once the prompt passes `trigger` tokens; the summary becomes the
    history's new start (Anthropic's compact_20260112)."""

    trigger: int = 150_000
    instructions: str | None = None  # added to the summarizer's instructions
    pause: bool = False  # answer with the summary alone (stop_reason "compaction")


ContextEdit = ClearToolUses | ClearThinking | Compact


@dataclass(slots=True)
class AppliedEdit:
    """An edit the proxy carried out for the client, reported back in the client's wire."""

    edit: str  # "clear_tool_uses", "clear_thinking" or "compaction"
    cleared: int = 0  # tool uses, or thinking turns, cleared
    tokens: int = 0  # estimated input tokens cleared
    summary: str | None = None  # a compaction's summary: the client's new history start


@dataclass(slots=True)
class ClientContext:
    """What the client says about its history's context, in no wire's terms: the edits it asks
    for (carried out by the proxy where the deployment does not serve them natively), and
    whether it manages the history's size itself, so that the proxy's compaction yields to it
    (`compaction.client_managed`)."""

    edits: tuple[ContextEdit, ...] = ()
    manages: bool = False  # the client's edits or compaction state cut this history
    applied: list[AppliedEdit] = field(default_factory=list)  # what the proxy carried out

    def edit(self, kind: type[Any]) -> Any:
        """The client's edit of that kind, if it asked for one."""
        return next((e for e in self.edits if isinstance(e, kind)), None)


@dataclass(slots=True)
class Identity:
    """Who sent the request and whose state it reaches: the same for every call made for it
    (its summaries included)."""

    request_id: str
    key: ApiKey | None = None
    owner: str = ""  # the tenant: "key:<name>", "team:<team>" or "open:"
    # The key of the session's state, scoped by its owner (proxy/sessions/identity.py): never
    # the bare name a client sent, so one tenant's id cannot reach another's state.
    session: str = ""
    session_name: str = ""  # the session id as the client knows it, for headers and logs
    # The client sent the id; else it is a fingerprint, narrowed to one conversation on
    # admission (proxy/sessions/lineage.py).
    session_given: bool = True
    # A subagent's parent, scoped like `session` (so only the caller's own): spend rolls up there.
    parent_session: str | None = None


@dataclass(slots=True)
class ClientRequest:
    """What the client asked, and how: the surface and wire it came in on, as it was sent."""

    route: str = "/v1/chat/completions"  # the surface it came in on: a metric label
    wire: str = CHAT  # the client's wire format: a Wire's name (proxy/wire/registry.py)
    # A client's request in a wire other than chat (None: chat's): `body` is then its
    # chat-shaped view (what the stages rewrite); `renderer` renders the outgoing request
    # from it, `native` reads what the view does not show (today each wire's view is both).
    renderer: Renderer | None = None
    native: NativeRequest | None = None
    # A chat client's: the wire its request goes in to a deployment that serves no chat.
    alternate: AlternateWire | None = None
    stream: bool = False
    wants_usage: bool = False  # a chat client asked for the usage chunk (stream_options)
    body_bytes: int = 0  # size of the request body as received
    # The alias the client asked for; `Exchange.alias` becomes the fallback's when one answers.
    requested_alias: str = ""
    # The client's messages as received, before any rewrite: a fallback re-fits these.
    original_messages: list[dict[str, Any]] | None = None
    # The history lives at the provider (previous_response_id): nothing of it is rewritten.
    opaque_history: bool = False
    # The client's protocol headers to pass on (anthropic-version, anthropic-beta).
    forward_headers: dict[str, str] = field(default_factory=dict)
    # The client's own context instructions and state (proxy/pipeline/context_edits.py).
    context: ClientContext | None = None
    # Top-level fields of `body` a fallback's capabilities changed (tools, max_tokens...),
    # as the client sent them ((False, None) when absent): restored before another fallback.
    fields_sent: dict[str, tuple[bool, Any]] = field(default_factory=dict)


@dataclass(slots=True)
class Rewrite:
    """What the rewrite chain learnt of this request's history, and what it saved."""

    # How many leading messages are equal to the previous turn's in this session (set by the
    # rewrite chain): stages redo work only past this point (pipeline/base.py:reusable).
    stable_prefix: int = 0
    # The turn it was measured against, and this request's own turn: opaque tokens (a bare
    # object each, holding nothing) a stage keeps with what it memoises, so it reuses only
    # what was computed on that very history.
    stable_base: object | None = None
    turn: object | None = None
    # What the lineage learnt of the history (its digest; a prefix it compared), for the chain.
    checked: Checked | None = None
    tokens_saved: int = 0  # estimated prompt tokens the stages removed from this request


@dataclass(slots=True)
class Exchange:
    identity: Identity
    config: Config  # the snapshot this request runs under, even if a reload happens meanwhile
    body: dict[str, Any]  # the parsed request; stages rewrite it in place
    alias: str  # the alias serving it: the requested one, or the fallback's once one answers
    policy: Policy
    client: ClientRequest = field(default_factory=ClientRequest)
    deployment: Deployment | None = None
    rewrite: Rewrite = field(default_factory=Rewrite)
    # The prompt as the proxy measured it for its decisions (compaction, budgets), if it did.
    prompt: PromptMeasure | None = None
    notes: list[Note] = field(default_factory=list)
    accounting: Accounting = field(default_factory=Accounting)
    timing: Timing = field(default_factory=Timing)
    recovery: Recovery = field(default_factory=Recovery)
    # Why the request failed after its answer began (a stream cut midway): it counts as failed.
    failure: Exception | None = None
    # The guards' per-session record (store/guard_record.py), once a guard has read it.
    guard_record: dict[str, Any] | None = None
    # A recorded request's native body as parsed, for the recording: a chat body's shallow
    # copy (the stages replace what they change, never mutate it), another wire's view's
    # (never mutated); None otherwise.
    received: dict[str, Any] | None = None
    # The body last sent upstream (control sets it on every call), for the recording.
    sent: dict[str, Any] | None = None
    # What a recorded session's stream wrote to the client, as written (None: not recorded).
    streamed: list[bytes] | None = None
    # The session's secrets by placeholder, when the guard scrubbed any (proxy/guards/secrets/): the
    # answer gives them back. Never recorded, never logged.
    secrets: Mapping[str, str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        client, identity = self.client, self.identity
        if not client.requested_alias:
            client.requested_alias = self.alias
        if not identity.session_name:
            identity.session_name = identity.session.partition("/")[2] or identity.session

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.body["messages"]
        return messages

    def add_usage(self, usage: Usage | None) -> None:
        """Usage over every upstream call this request made (recall rounds, retries)."""
        if usage is None:
            return
        accounting = self.accounting
        if accounting.usage is None:
            accounting.usage = Usage()
        accounting.usage.add(usage)
        accounting.usage_reports += 1

    def add_side_call(self, child: Exchange) -> None:
        """`child` was a call made for this request (a summary): what it used is charged here,
        its wait on the upstream is not the proxy's own time, and what control did for it
        (retries, fallbacks) shows with this request's notes."""
        used = child.accounting.usage
        if used is not None:
            self.accounting.side_calls.append(Charge(child.alias, child.deployment, used))
        self.timing.upstream_wait += child.timing.upstream_wait
        self.notes.extend(child.notes)

    def add_unreported_usage(self, completion_tokens: int = 0) -> None:
        """A call cut short (the client left, the stream broke) before the provider reported
        its usage: the provider bills it anyway, so an estimate is charged instead. The
        prompt as the budget guard estimates it; the completion as the caller counted it
        (one token per streamed event)."""
        prompt = self.estimated_prompt()
        self.add_usage(Usage(prompt, completion_tokens))
        self.accounting.usage_estimated = True
        self.note("usage", "estimated", prompt_tokens=prompt, completion_tokens=completion_tokens)

    @property
    def translated(self) -> bool:
        """A client whose wire the chosen deployment does not speak: its view goes as chat."""
        renderer = self.client.renderer
        return (
            renderer is not None
            and self.deployment is not None
            and not renderer.native_for(self.deployment)
        )

    def outgoing(self, deployment: Deployment) -> tuple[dict[str, Any], dict[str, str] | None]:
        """The body (and protocol headers) to send to `deployment`: the client's own wire
        when the deployment speaks it, else the chat-shaped request."""
        renderer = self.client.renderer
        if renderer is None:
            alternate = self.client.alternate
            if alternate is not None and alternate.applies(deployment):
                return alternate.render(self.body), None
            return self.body, None
        if renderer.native_for(deployment):
            return renderer.render(self.body), self.client.forward_headers or None
        return renderer.translated(self.body), None

    def wire_for(self, deployment: Deployment) -> str:
        """The wire the request goes out in to `deployment` (its native upstream, if any)."""
        alternate = self.client.alternate
        if alternate is not None and alternate.applies(deployment):
            return alternate.wire
        return self.client.wire

    def estimated_prompt(self) -> int:
        """The prompt the decisions were made on (compaction measured it: counted, calibrated)
        when there is one; else the body's size over four, at most the window: O(1), and on
        the high side, as a guard (and a charge for usage never reported) should be."""
        if self.prompt is not None:
            return self.prompt.estimate
        estimate = self.client.body_bytes // 4
        window = self.deployment.max_input_tokens if self.deployment else None
        return min(estimate, window) if window else estimate

    @property
    def dry_run(self) -> bool:
        return self.policy.mode == "dry_run"

    def note(self, stage: str, action: str, **fields: Any) -> None:
        self.notes.append(Note(stage, action, fields))

    def server_timing(self) -> str:
        """The `server-timing` header: the proxy's own time and the upstream's, in ms."""
        proxy, upstream = self.overhead() * 1000, self.timing.upstream_wait * 1000
        return f"proxy;dur={proxy:.3f}, upstream;dur={upstream:.3f}"

    def overhead(self, now: float | None = None) -> float:
        timing = self.timing
        elapsed = (now or time.perf_counter()) - timing.started
        return max(0.0, elapsed - timing.upstream_wait - timing.client_wait)
