"""Factory-built exchanges, histories and contexts for the compaction tests: a 2,000-token
window and short arguments, so compaction events happen often."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from proxy.control.control import Control
from proxy.exchange import Exchange, Identity
from proxy.messages import Message
from proxy.metrics import Metrics
from proxy.model_catalog import ModelCatalog
from proxy.pipeline.base import StageContext, Summarizer
from proxy.pipeline.compaction.summarizer import SYSTEM_PROMPT, make_summarizer
from proxy.pipeline.meter import PromptMeter
from proxy.policies.spec import CompactionSpec, Config, Deployment, Policy
from proxy.recording.events import EventLog
from proxy.recording.recorder import Recorder
from proxy.sim.model import summary_sections
from proxy.store.memory import MemoryStore
from proxy.store.state import MemoryState
from proxy.tokens.tokenizers import Tokenizers
from proxy.upstream.pool import Upstreams

WINDOW = 2_000
SIM_KEY = "sk-sim-upstream-secret"
GOAL = "Build a CSV report tool in src/report.py that sums the amounts per customer"
WELL_FORMED = "SESSION INTENT:\ng\n\nSUMMARY:\ns\n\nARTIFACTS:\n- none\n\nNEXT STEPS:\nn"
SYSTEM: Message = {"role": "system", "content": "You are a careful coding agent."}
SPEC = CompactionSpec(truncate_min_chars=400, truncate_head_chars=40)
POLICY = Policy(name="test", compaction=SPEC)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name in ("write_file", "read_file")
]


def target(window: int | None = WINDOW, api_base: str = "http://127.0.0.1:9/v1") -> Deployment:
    return Deployment(
        alias="sim",
        model="openai/sim",
        provider="openai",
        upstream_model="sim",
        api_base=api_base,
        api_key=SIM_KEY,
        max_input_tokens=window,
    )


def exchange(
    messages: list[Message],
    *,
    policy: Policy = POLICY,
    session: str = "s1",
    deployment: Deployment | None = None,
    **body: Any,
) -> Exchange:
    chosen = deployment or target()
    ex = Exchange(
        identity=Identity("req-1", session=session),
        config=Config(version="t", sources=(), loaded_at=0, deployments={"sim": (chosen,)}),
        body={"model": "sim", "messages": messages, **body},
        alias="sim",
        policy=policy,
    )
    ex.deployment = chosen
    return ex


class Scripted:
    """A summarize callable that answers from a script and remembers what it was given."""

    def __init__(self, answer: str | BaseException | None = None, delay_s: float = 0.0) -> None:
        self.answer = answer
        self.delay_s = delay_s
        self.calls: list[list[Message]] = []
        self.rooms: list[int] = []

    async def __call__(self, ex: Exchange, messages: list[Message], room: int = 500) -> str:
        self.calls.append(messages)
        self.rooms.append(room)
        await asyncio.sleep(self.delay_s)
        if isinstance(self.answer, BaseException):
            raise self.answer
        if self.answer is not None:
            return self.answer
        first = next(m["content"] for m in messages if m.get("role") == "user")
        intent = summary_sections(first).get("SESSION INTENT", first)  # carried forward
        return (
            f"SESSION INTENT:\n{intent}\n\nSUMMARY:\n{len(messages)} messages\n\n"
            "ARTIFACTS:\n- none\n\nNEXT STEPS:\ngo"
        )


def real_summarizer(upstreams: Upstreams) -> Summarizer:
    """The summarizer as the app wires it: its calls go through control."""
    metrics = Metrics()
    recorder = Recorder(metrics, EventLog(None))
    return make_summarizer(Control(upstreams, metrics, MemoryState(), recorder), metrics)


def context(summarize: Summarizer, store: MemoryStore | None = None) -> StageContext:
    return StageContext(
        store=store or MemoryStore(),
        catalog=ModelCatalog(),
        metrics=Metrics(),
        events=EventLog(None),
        summarize=summarize,
        # Compaction on the estimate (characters / 4): the exact counts near the trigger and
        # the calibration are tests/tokens' and tests/routes/test_prompt_tokens.py's.
        meter=PromptMeter(Tokenizers(loader=None)),
    )


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def call(call_id: str, name: str, **arguments: Any) -> Message:
    function = {"name": name, "arguments": orjson.dumps(arguments).decode()}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def result(call_id: str, text: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def coding_session(turns: int, content_chars: int = 600) -> list[Message]:
    """System, the goal, then per turn: write a file, its result, a short user follow-up."""
    history = [SYSTEM, user(GOAL)]
    for i in range(turns):
        body = f"# module {i}\n" + "x = 1\n" * (content_chars // 6)
        history += [
            call(f"call_{i}", "write_file", path=f"src/mod{i}.py", content=body),
            result(f"call_{i}", f"wrote {len(body)} bytes to src/mod{i}.py"),
            user(f"Good. Now step {i + 1}."),
        ]
    return history


def actions(ex: Exchange) -> list[str]:
    return [n.action for n in ex.notes]


def note(ex: Exchange, action: str) -> dict[str, Any]:
    return next(n.fields for n in ex.notes if n.action == action)


def is_summary_request(body: dict[str, Any]) -> bool:
    return bool(body["messages"][0]["content"] == SYSTEM_PROMPT)


def wire(messages: list[Message]) -> list[bytes]:
    """What each message looks like on the wire: the unit of byte-for-byte stability."""
    return [orjson.dumps(m) for m in messages]
