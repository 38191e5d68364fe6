"""The chain's laws: fail-safe on crashes and invalid output, dry-run, visible decisions."""

from __future__ import annotations

from pathlib import Path

import orjson

from proxy.exchange import Exchange
from proxy.messages import Message
from proxy.pipeline.base import StageContext
from proxy.pipeline.chain import Chain
from proxy.policies.spec import Policy
from proxy.recording.events import EventLog
from tests.pipeline.factories import context, exchange

USER: Message = {"role": "user", "content": "hi"}


class Appender:
    name = "appender"

    def enabled(self, policy: Policy) -> bool:
        return True

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        ex.note(self.name, "appended")
        return [*messages, {"role": "user", "content": "added"}]


class Crasher(Appender):
    name = "crasher"

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        raise ValueError("stage bug")


class Breaker(Appender):
    name = "breaker"

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        return [*messages, {"role": "tool", "tool_call_id": "nowhere", "content": "x"}]


class Disabled(Appender):
    name = "disabled"

    def enabled(self, policy: Policy) -> bool:
        return False


async def test_stages_apply_in_order_and_reach_the_body() -> None:
    ex = exchange([USER])
    sent = await Chain([Appender(), Disabled(), Appender()]).rewrite(ex, context())
    assert [m["content"] for m in sent] == ["hi", "added", "added"]
    assert ex.body["messages"] is sent


async def test_a_crashing_stage_is_skipped_and_recorded(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    ctx = context(events=EventLog(str(log)))
    ex = exchange([USER])
    sent = await Chain([Crasher(), Appender()]).rewrite(ex, ctx)
    assert [m["content"] for m in sent] == ["hi", "added"]
    assert [(n.stage, n.action) for n in ex.notes] == [
        ("crasher", "stage_failed"),
        ("appender", "appended"),
    ]
    ctx.events.flush()
    event = orjson.loads(log.read_bytes().splitlines()[0])
    assert event["stage"] == "crasher" and "stage bug" in event["error"]
    assert event["request_id"] == "req-1" and event["session"] == "s1"
    counted = ctx.metrics.rewrites.labels("crasher", "stage_failed")._value.get()
    assert counted == 1


async def test_an_invalid_history_is_never_sent() -> None:
    ex = exchange([USER])
    sent = await Chain([Breaker()]).rewrite(ex, context())
    assert sent == [USER]
    assert ex.notes[0].action == "rejected_invalid"
    assert "orphan" in ex.notes[0].fields["problems"][0]


async def test_dry_run_reports_but_sends_the_original() -> None:
    ex = exchange([USER], policy=Policy(name="p", mode="dry_run"))
    sent = await Chain([Appender()]).rewrite(ex, context())
    assert sent == [USER] and ex.body["messages"] == [USER]
    assert ex.notes[0].action == "appended"
