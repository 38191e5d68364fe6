"""The Exchange: one object per request, passed through every stage of the pipeline."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from proxy.policies.spec import ApiKey, Config, Deployment, Policy


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def from_openai(cls, usage: Any) -> Usage | None:
        if not isinstance(usage, dict):
            return None
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return None
        return cls(prompt, completion)


@dataclass(slots=True)
class Note:
    """One rewrite or policy decision, reported in headers, metrics and the event log."""

    stage: str
    action: str
    fields: dict[str, Any] = field(default_factory=dict)  # counts, tokens before/after, refs


@dataclass(slots=True)
class Exchange:
    request_id: str
    config: Config  # the snapshot this request runs under, even if a reload happens meanwhile
    key: ApiKey | None
    body: dict[str, Any]  # the parsed request; stages rewrite it in place
    alias: str
    policy: Policy
    session: str = ""
    parent_session: str | None = None  # a subagent's parent: its spend rolls up there
    body_bytes: int = 0  # size of the request body as received
    # How many leading messages are equal to the previous turn's in this session (set by the
    # rewrite chain): stages redo work only past this point.
    stable_prefix: int = 0
    stream: bool = False
    client_wants_usage: bool = False
    deployment: Deployment | None = None
    notes: list[Note] = field(default_factory=list)
    usage: Usage | None = None
    started: float = field(default_factory=time.perf_counter)
    # Time spent awaiting the upstream and the client; the rest is the proxy's own overhead.
    upstream_wait: float = 0.0
    client_wait: float = 0.0

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.body["messages"]
        return messages

    def add_usage(self, usage: Usage | None) -> None:
        """Usage over every upstream call this request made (recall rounds, retries)."""
        if usage is None:
            return
        if self.usage is None:
            self.usage = Usage()
        self.usage.prompt_tokens += usage.prompt_tokens
        self.usage.completion_tokens += usage.completion_tokens

    @property
    def dry_run(self) -> bool:
        return self.policy.mode == "dry_run"

    def note(self, stage: str, action: str, **fields: Any) -> None:
        self.notes.append(Note(stage, action, fields))

    def overhead(self, now: float | None = None) -> float:
        elapsed = (now or time.perf_counter()) - self.started
        return max(0.0, elapsed - self.upstream_wait - self.client_wait)
