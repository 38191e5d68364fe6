"""How long the history rewrite takes per turn, for agent histories of 10, 100 and 1,000 messages.

An agent re-sends its whole history every turn, so the rewrite (Rewriter.before_call: repair,
offload, compaction, then the recall-tool offer) runs over all of it every turn. The goal
(issue 3, "Speed") is that a turn costs what its *new* messages cost: warm <= 2 ms at 1,000
messages (~1 MB of JSON) and flat in history length.

    python bench/rewrite.py              # ~10-20 s
    python bench/rewrite.py --quick      # fewer turns, ~2-5 s: smoke test
    python bench/rewrite.py --profile    # then cProfile the warm 1,000-message turn per variant

In-process, no network. Each measured turn parses the serialized history afresh (timed apart
from the rewrite) into a new Exchange, as a request would. The summarizer is an instant stub
returning a fixed structured summary: compaction figures exclude model time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import math
import os
import platform
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from _payloads import string_tool

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as `python bench/rewrite.py` from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from proxy.exchange import Exchange, Identity  # noqa: E402
from proxy.messages import Message  # noqa: E402
from proxy.metrics import Metrics  # noqa: E402
from proxy.model_catalog import ModelCatalog  # noqa: E402
from proxy.pipeline.base import Stage, StageContext  # noqa: E402
from proxy.pipeline.compaction.budget import schema_tokens, tokens_of  # noqa: E402
from proxy.pipeline.rewriter import Rewriter  # noqa: E402
from proxy.policies.spec import Config, Deployment, OffloadSpec, Policy  # noqa: E402
from proxy.recording.events import EventLog  # noqa: E402
from proxy.store.local import LocalStore  # noqa: E402

SIZES = (10, 100, 1_000)
SESSION = "bench-session"
SEED = 20_240_601
ALIAS = "bench"

# --- targets ---------------------------------------------------------------------------------

TARGET_WARM_MS = 2.0  # warm p50 at the largest size
TARGET_FLAT_RATIO = 2.0  # warm p50 at 1,000 messages over warm p50 at 10: "flat"


# --- a deterministic agent history -----------------------------------------------------------

WORDS = (
    "request", "session", "store", "message", "handler", "result", "payload", "window", "budget",
    "token", "cache", "stage", "policy", "upstream", "client", "stream", "chunk", "usage",
    "metric", "config", "parser", "schema", "offload", "summary", "checkpoint", "archive",
    "pointer", "preview", "record", "event", "header", "route", "key", "alias", "model", "deploy",
    "retry", "timeout", "limit", "buffer", "encode", "decode", "hash", "index", "prefix",
    "suffix", "history", "compact", "repair",
)  # fmt: skip
TYPES = ("str", "int", "bytes", "Message", "list[Message]", "dict[str, Any]", "Exchange")
SENTENCES = (
    "Keep the original bytes so a later turn sees the same prefix.",
    "The store write must commit before the message is replaced.",
    "Fall back to the previous list when the stage breaks the pairing rules.",
    "Only the new messages should cost anything on a warm turn.",
    "Estimate tokens from characters; calibrate against reported usage later.",
)
CODE_TEMPLATES = (
    "def {a}_{b}(self, {c}: {T}, *, {d}: int = {n}) -> {T} | None:",
    '    """{S}"""',
    "    {a} = self._{b}.get({c}, {d})",
    "    if {a} is None or len({b}) > {n}:",
    "        return await self.{a}_{b}({c}, {d}={e})",
    "    for {a}, {b} in enumerate(self.{c}):",
    "        {a}[{b}] = {c}.{d}({e}, timeout={n}.0)",
    "    # {S}",
    "class {A}{B}({A}Base):",
    '    log.debug("{a} %s {b} %d", {c}, len({d}))',
    '    raise {A}Error(f"{a} {{{b}!r}} failed after {{{c}}} tries")',
    "",
    "from proxy.{a}.{b} import {A}{B}, {c}_{d}",
)
LOG_TEMPLATES = (
    "2024-06-01T12:{m:02d}:{s:02d}.{ms:03d}Z INFO  agentproxy.{a}: {b} {c} in {n} ms",
    "2024-06-01T12:{m:02d}:{s:02d}.{ms:03d}Z WARN  agentproxy.{a}: {b} retry {p} for {c}",
    "tests/{a}/test_{b}.py::test_{c}_{d} PASSED                                [{p:3d}%]",
    "tests/{a}/test_{b}.py::test_{c}_{d} FAILED                                [{p:3d}%]",
    '  File "/work/main/proxy/{a}/{b}.py", line {n}, in {c}_{d}',
    "E       AssertionError: assert {n} == {p}",
    "{a}/{b}.py:{n}:{p}: F841 local variable '{c}' is assigned to but never used",
)
SYSTEM_PROMPT = "\n\n".join(
    [
        "You are a coding agent working in a git repository on the user's machine. You read "
        "and change files with the tools you are given, run commands, and report back.",
        "Guidelines:\n"
        + "\n".join(
            f"- {rule}"
            for rule in (
                "Read a file before you edit it; never guess at its contents.",
                "Prefer small, focused edits over rewriting whole files.",
                "Run the test suite after every change and fix what you broke.",
                "Keep the user's constraints: style, dependencies, public interfaces.",
                "When a command fails, read the whole error before trying again.",
                "Do not commit; the user reviews and commits.",
                "Explain what you changed and why in two or three sentences at the end.",
                "Never print secrets, tokens or keys found in files or the environment.",
                "Ask before deleting files or running commands with side effects outside "
                "the repository.",
            )
        ),
        "Tool use: call tools with JSON arguments exactly matching their schema. Several "
        "independent reads may be issued in one turn. Paths are relative to the repository "
        "root. Long outputs are cut; narrow your command instead of asking for more.",
        "Repository layout: proxy/ holds the package (pipeline/, store/, upstream/, routes/, "
        "policies/), tests/ mirrors it, bench/ holds benchmarks, docs/ the user guide. The "
        "project uses Python 3.11, aiohttp, orjson, xxhash, SQLite; ruff and mypy --strict "
        "must stay clean; pytest runs with asyncio_mode=auto.",
        "Current date: 2024-06-01. The user's shell is bash on Linux. " + " ".join(SENTENCES * 4),
    ]
)


TOOLS = [
    string_tool("read_file", "Read a text file; returns numbered lines.", path="file path"),
    string_tool(
        "write_file",
        "Create or overwrite a file with the given content.",
        path="file path",
        content="the whole new content",
    ),
    string_tool(
        "edit_file",
        "Replace one exact occurrence of old_string with new_string.",
        path="file path",
        old_string="text to replace, exactly as in the file",
        new_string="the replacement",
    ),
    string_tool(
        "bash", "Run a shell command in the repository; returns its output.", command="cmd"
    ),
    string_tool("grep", "Search files for a regular expression.", pattern="regex", path="folder"),
    string_tool("list_dir", "List a directory.", path="folder"),
]

Block = list[Message]


class HistoryWriter:
    """A coding agent's session: reads, greps, test runs, edits, whole-file writes, and now and
    then a user turn. Same seed, same bytes. About 1 KB of JSON per message on average, with a
    few tool results of 10-30 KB (the first one early) and write_file bodies of 1-4 KB."""

    LARGE_SHARE = 0.035  # of read_file / bash results

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        pools = random.Random(seed ^ 0x5EED)
        self.code = [self._fill(pools, pools.choice(CODE_TEMPLATES)) for _ in range(3_000)]
        self.logs = [self._fill(pools, pools.choice(LOG_TEMPLATES)) for _ in range(2_000)]
        self.paths = [f"proxy/{pools.choice(WORDS)}/{pools.choice(WORDS)}.py" for _ in range(80)]
        self.blocks = 0

    @staticmethod
    def _fill(rng: random.Random, template: str) -> str:
        w = rng.choice
        return template.format(
            a=w(WORDS), b=w(WORDS), c=w(WORDS), d=w(WORDS), e=w(WORDS),
            A=w(WORDS).title(), B=w(WORDS).title(), T=w(TYPES), S=w(SENTENCES),
            n=rng.randrange(2, 2_000), p=rng.randrange(0, 100),
            m=rng.randrange(60), s=rng.randrange(60), ms=rng.randrange(1_000),
        )  # fmt: skip

    def _slice(self, pool: list[str], chars: int) -> list[str]:
        start = self.rng.randrange(len(pool))
        lines: list[str] = []
        size = 0
        while size < chars:
            line = pool[(start + len(lines)) % len(pool)]
            lines.append(line)
            size += len(line) + 1
        return lines

    def _words(self, count: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(count))

    def _call_id(self) -> str:
        return f"call_{self.rng.getrandbits(96):024x}"

    def _chars(self, low: int, high: int) -> int:
        """A result size: usually in [low, high), now and then large (over ~10k chars)."""
        if self.blocks == 3:  # the agent ran the whole test suite early on
            return self.rng.randrange(12_000, 14_000)
        if self.rng.random() < self.LARGE_SHARE:
            return self.rng.randrange(10_000, 30_000)
        return self.rng.randrange(low, high)

    # Each tool: (name, arguments, result text).
    def read_file(self) -> tuple[str, dict[str, Any], str]:
        chars = self._chars(150, 2_000)
        first = self.rng.randrange(1, 400)
        lines = self._slice(self.code, chars)
        text = "\n".join(f"{first + i:>6}\t{line}" for i, line in enumerate(lines))
        return "read_file", {"path": self.rng.choice(self.paths)}, text

    def bash(self) -> tuple[str, dict[str, Any], str]:
        chars = self._chars(100, 1_300)
        command = self.rng.choice(
            ("pytest -q tests/", "ruff check proxy", "git diff --stat", "python -m proxy check")
        )
        return "bash", {"command": command}, "\n".join(self._slice(self.logs, chars))

    def grep(self) -> tuple[str, dict[str, Any], str]:
        hits = [
            f"{self.rng.choice(self.paths)}:{self.rng.randrange(1, 900)}:{line.strip()}"
            for line in self._slice(self.code, self.rng.randrange(100, 1_500))
        ]
        arguments = {"pattern": rf"def {self.rng.choice(WORDS)}_\w+", "path": "proxy"}
        return "grep", arguments, "\n".join(hits)

    def list_dir(self) -> tuple[str, dict[str, Any], str]:
        names = sorted({p.rsplit("/", 1)[1] for p in self.rng.sample(self.paths, 12)})
        return "list_dir", {"path": "proxy/pipeline"}, "\n".join(names)

    def write_file(self) -> tuple[str, dict[str, Any], str]:
        path = self.rng.choice(self.paths)
        content = "\n".join(self._slice(self.code, self.rng.randrange(1_000, 4_000))) + "\n"
        return (
            "write_file",
            {"path": path, "content": content},
            f"Wrote {len(content.encode()):,} bytes to {path}",
        )

    def edit_file(self) -> tuple[str, dict[str, Any], str]:
        path = self.rng.choice(self.paths)
        old = "\n".join(self._slice(self.code, self.rng.randrange(80, 600)))
        new = "\n".join(self._slice(self.code, self.rng.randrange(80, 600)))
        arguments = {"path": path, "old_string": old, "new_string": new}
        return "edit_file", arguments, f"The file {path} has been edited: 1 replacement."

    def tool_block(self, tools: list[tuple[str, dict[str, Any], str]]) -> Block:
        ids = [self._call_id() for _ in tools]
        thought = self.rng.random() < 0.4
        assistant: Message = {
            "role": "assistant",
            "content": f"Next I'll check the {self._words(6)}." if thought else None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
                }
                for call_id, (name, arguments, _) in zip(ids, tools, strict=True)
            ],
        }
        results = [
            {"role": "tool", "tool_call_id": call_id, "content": text}
            for call_id, (_, _, text) in zip(ids, tools, strict=True)
        ]
        return [assistant, *results]

    def user_turn(self) -> Block:
        report = f"Done: {self._words(self.rng.randrange(30, 140))}."
        ask = f"Thanks. Now {self._words(self.rng.randrange(15, 90))}."
        return [{"role": "assistant", "content": report}, {"role": "user", "content": ask}]

    def step(self) -> Block:
        """One agent step: a single tool call and its result (what an appended turn adds)."""
        tool = self.rng.choices(
            (self.read_file, self.bash, self.grep, self.edit_file), (30, 25, 20, 15)
        )[0]
        return self.tool_block([tool()])

    def block(self) -> Block:
        self.blocks += 1
        r = self.rng.random()
        if r < 0.05:
            return self.user_turn()
        if r < 0.13:  # parallel reads
            return self.tool_block([self.read_file() for _ in range(self.rng.randrange(2, 4))])
        if r < 0.25:
            return self.tool_block([self.write_file()])
        if r < 0.28:
            return self.tool_block([self.list_dir()])
        return self.step()

    def history(self, n: int) -> list[Message]:
        """Exactly n messages that keep the pairing rules."""
        out: list[Message] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "The offload stage re-reads every message each turn. "
             + self._words(60)},
        ]  # fmt: skip
        while len(out) < n:
            block = self.block()
            room = n - len(out)
            if len(block) > room:  # end on a user turn instead (or just its user message)
                block = self.user_turn()[-room:]
            out.extend(block)
        return out


def histories(seed: int, sizes: tuple[int, ...], appended: int) -> dict[int, list[Message]]:
    """History per size, plus `appended` extra steps (2 messages each) after each one."""
    out: dict[int, list[Message]] = {}
    for n in sizes:
        writer = HistoryWriter(seed)
        messages = writer.history(n)
        for _ in range(appended):
            messages.extend(writer.step())
        out[n] = messages
    return out


def body_of(messages: list[Message]) -> dict[str, Any]:
    return {"model": ALIAS, "messages": messages, "tools": TOOLS, "stream": True}


# --- the proxy side --------------------------------------------------------------------------

SUMMARY = """\
SESSION INTENT:
Make the offload stage cost only what new messages cost; keep every test green.

SUMMARY:
Read the pipeline stages, found the per-turn re-reads, added caches keyed by message hash;
two tests failed on a stale fixture and were fixed.

ARTIFACTS:
proxy/pipeline/offload.py - the stage being optimized
tests/pipeline/test_offload.py - its tests

NEXT STEPS:
Run the benchmark again and compare warm turns at 1,000 messages."""


class InstantSummarizer:
    """Stands in for the model: a fixed structured summary, at once (no model time)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, ex: Exchange, messages: list[Message], room: int) -> str:
        self.calls += 1
        return SUMMARY


class TimedStage:
    """Wraps a stage to add up the wall time of its runs (awaits on the store included)."""

    def __init__(self, inner: Stage) -> None:
        self.inner = inner
        self.name = inner.name
        self.preserves_pairing = getattr(inner, "preserves_pairing", False)
        self.spent = 0.0

    def enabled(self, policy: Policy) -> bool:
        return self.inner.enabled(policy)

    async def run(
        self, ex: Exchange, messages: list[Message], ctx: StageContext
    ) -> list[Message] | None:
        started = time.perf_counter()
        try:
            return await self.inner.run(ex, messages, ctx)
        finally:
            self.spent += time.perf_counter() - started


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    what: str
    policy: Policy
    window: Callable[[int], int]  # from the history's estimated tokens (tools included)
    expect: str | None  # the action a cold turn must record at 1,000 messages


VARIANTS = (
    Variant(
        "idle",
        "nothing triggers: 1M-token window, default offload threshold (20k tokens)",
        Policy(name="bench-idle"),
        lambda tokens: 1_000_000,
        None,
    ),
    Variant(
        "offload",
        "offload min_tokens 2,000 (results over ~8k chars), 1M-token window",
        Policy(name="bench-offload", offload=OffloadSpec(min_tokens=2_000)),
        lambda tokens: 1_000_000,
        "offload.offloaded",
    ),
    Variant(
        "compact",
        "window = 0.6 x the history's tokens: compaction summarizes on the cold turn, "
        "later turns reuse the checkpoint",
        Policy(name="bench-compact"),
        lambda tokens: int(tokens * 0.6),
        "compaction.summarized",
    ),
)


class Session:
    """A Rewriter as the app builds it, on a fresh LocalStore and event log in `directory`."""

    def __init__(self, variant: Variant, window: int, directory: str) -> None:
        self.variant = variant
        self.store = LocalStore(directory)
        self.events = EventLog(str(Path(directory) / "events.jsonl"))
        self.summarizer = InstantSummarizer()
        ctx = StageContext(self.store, ModelCatalog(), Metrics(), self.events, self.summarizer)
        self.rewriter = Rewriter(ctx)
        self.stages = [TimedStage(stage) for stage in self.rewriter.chain.stages]
        self.rewriter.chain.stages = tuple(self.stages)
        self.deployment = Deployment(
            alias=ALIAS,
            model=f"openai/{ALIAS}",
            provider="openai",
            upstream_model=ALIAS,
            api_base="http://127.0.0.1:9/v1",
            api_key=None,
            max_input_tokens=window,
        )
        self.config = Config(
            version="bench", sources=(), loaded_at=0, deployments={ALIAS: (self.deployment,)}
        )

    def parse(self, data: bytes) -> tuple[Exchange, float]:
        started = time.perf_counter()
        body = orjson.loads(data)
        parse_s = time.perf_counter() - started
        ex = Exchange(
            identity=Identity("bench", session=SESSION),
            config=self.config,
            body=body,
            alias=ALIAS,
            policy=self.variant.policy,
        )
        ex.deployment = self.deployment
        return ex, parse_s

    async def turn(self, ex: Exchange, profiler: cProfile.Profile | None = None) -> Turn:
        for stage in self.stages:
            stage.spent = 0.0
        if profiler is not None:
            profiler.enable()
        started = time.perf_counter()
        await self.rewriter.before_call(ex)
        elapsed = time.perf_counter() - started
        if profiler is not None:
            profiler.disable()
        by_stage = {stage.name: stage.spent * 1e3 for stage in self.stages}
        actions = Counter(f"{note.stage}.{note.action}" for note in ex.notes)
        return Turn(elapsed * 1e3, by_stage, actions)

    async def close(self) -> None:
        await self.store.close()
        self.events.close()


@dataclass(slots=True)
class Turn:
    ms: float
    by_stage: dict[str, float]
    actions: Counter[str]


# --- measuring -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    passes: int  # rounds over every variant and size, samples pooled: spreads out disturbances
    cold_runs: int  # per pass
    warmup_turns: int
    warm_turns: dict[int, int]  # per pass
    appended_turns: dict[int, int]  # per pass


# Appended turns grow the history by 2 messages each: 10 -> 30, 100 -> 140, 1,000 -> 1,080.
FULL = Settings(3, 2, 3, {10: 400, 100: 150, 1_000: 50}, {10: 10, 100: 20, 1_000: 40})
QUICK = Settings(1, 2, 2, {10: 60, 100: 30, 1_000: 12}, {10: 5, 100: 10, 1_000: 10})


@dataclass(slots=True)
class Row:
    variant: Variant
    messages: int
    json_bytes: int
    tokens: int
    window: int
    parse_ms: list[float] = field(default_factory=list)
    cold: list[Turn] = field(default_factory=list)
    warm: list[Turn] = field(default_factory=list)
    appended: list[Turn] = field(default_factory=list)
    summarizer_cold: int = 0  # calls over all cold turns
    summarizer_warm: int = 0  # must stay 0: the same history reuses the checkpoint
    summarizer_appended: int = 0  # compaction events while the history grows

    def merge(self, other: Row) -> None:
        self.parse_ms += other.parse_ms
        self.cold += other.cold
        self.warm += other.warm
        self.appended += other.appended
        self.summarizer_cold += other.summarizer_cold
        self.summarizer_warm += other.summarizer_warm
        self.summarizer_appended += other.summarizer_appended

    def p(self, turns: list[Turn], q: float) -> float:
        return percentile([t.ms for t in turns], q)

    def stage_p50(self, name: str) -> float:
        return statistics.median(t.by_stage.get(name, 0.0) for t in self.warm)

    def rest_p50(self) -> float:
        """Chain and recall offer: the turn minus its stages (pairing checks, recall offer)."""
        return statistics.median(t.ms - sum(t.by_stage.values()) for t in self.warm)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def measure(
    variant: Variant, size: int, full: list[Message], settings: Settings, tmp: Path
) -> Row:
    messages = full[:size]
    data = orjson.dumps(body_of(messages))
    tokens = tokens_of(messages) + schema_tokens(TOOLS)
    window = variant.window(tokens)
    row = Row(variant, size, len(data), tokens, window)
    for run in range(settings.cold_runs):
        directory = tempfile.mkdtemp(prefix=f"{variant.name}-{size}-{run}-", dir=tmp)
        session = Session(variant, window, directory)
        try:
            await session.store.open()  # creating the SQLite file is a process start cost
            gc.collect()
            ex, parse_s = session.parse(data)
            row.parse_ms.append(parse_s * 1e3)
            row.cold.append(await session.turn(ex))
            del ex
            row.summarizer_cold += session.summarizer.calls
            if run == settings.cold_runs - 1:  # the last cold session goes on warm
                await warm_and_appended(session, row, full, size, data, settings)
        finally:
            await session.close()
    return row


async def warm_and_appended(
    session: Session, row: Row, full: list[Message], size: int, data: bytes, settings: Settings
) -> None:
    for _ in range(settings.warmup_turns):
        ex, _ = session.parse(data)
        await session.turn(ex)
    gc.collect()
    before = session.summarizer.calls
    for _ in range(settings.warm_turns[size]):
        ex, parse_s = session.parse(data)
        row.parse_ms.append(parse_s * 1e3)
        row.warm.append(await session.turn(ex))
        del ex
    row.summarizer_warm = session.summarizer.calls - before
    gc.collect()
    before = session.summarizer.calls
    for step in range(1, settings.appended_turns[size] + 1):
        grown = orjson.dumps(body_of(full[: size + 2 * step]))
        ex, _ = session.parse(grown)
        row.appended.append(await session.turn(ex))
        del ex
    row.summarizer_appended = session.summarizer.calls - before


async def profile(variant: Variant, size: int, full: list[Message], turns: int, tmp: Path) -> str:
    """cProfile of `turns` warm turns (the rewrite only), top functions by own time."""
    messages = full[:size]
    data = orjson.dumps(body_of(messages))
    window = variant.window(tokens_of(messages) + schema_tokens(TOOLS))
    session = Session(variant, window, tempfile.mkdtemp(prefix=f"profile-{variant.name}-", dir=tmp))
    profiler = cProfile.Profile()
    try:
        for _ in range(4):  # cold, then warm-up
            ex, _ = session.parse(data)
            await session.turn(ex)
        for _ in range(turns):
            ex, _ = session.parse(data)
            await session.turn(ex, profiler)
    finally:
        await session.close()
    return format_profile(variant, size, pstats.Stats(profiler), turns)


def format_profile(variant: Variant, size: int, stats: pstats.Stats, turns: int) -> str:
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    raw = stats.stats  # type: ignore[attr-defined]
    rows = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)
    lines = [
        f"profile: {variant.name}, warm, {size} messages, {turns} turns (cProfile inflates "
        "Python-level calls; read the shares, not the absolute times)",
        f"{'own ms/turn':>11} {'cum ms/turn':>11} {'calls/turn':>10}  function",
    ]
    for (file, line, function), (_, calls, own, cumulative, _) in rows[:15]:
        lines.append(
            f"{own * 1e3 / turns:>11.3f} {cumulative * 1e3 / turns:>11.3f} "
            f"{calls / turns:>10.0f}  {_where(file, line)} {function}"
        )
    return "\n".join(lines)


def _where(file: str, line: int) -> str:
    """repo-relative file:line; a library by its package path; a builtin as (builtin)."""
    if file == "~":
        return "(builtin)"
    if file.startswith("<"):
        return file
    path = Path(file).resolve()
    if path.is_relative_to(REPO_ROOT):
        return f"{path.relative_to(REPO_ROOT)}:{line}"
    parts = path.parts
    start = parts.index("site-packages") + 1 if "site-packages" in parts else len(parts) - 2
    return f"{'/'.join(parts[start:])}:{line}"


# --- how quiet the machine was ---------------------------------------------------------------

BUSY_MACHINE_CPUS = 0.1  # other processes using more than this on average spoil the numbers


def machine_busy_s() -> float | None:
    """CPU seconds the whole machine spent busy since boot (/proc/stat), None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:4]
    except OSError:
        return None
    return sum(int(x) for x in fields) / os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class Quietness:
    started: float = field(default_factory=time.perf_counter)
    busy: float | None = field(default_factory=machine_busy_s)
    own: float = field(default_factory=time.process_time)

    def others_cpus(self) -> float | None:
        """Average CPUs used by other processes since this object was made."""
        busy = machine_busy_s()
        if busy is None or self.busy is None:
            return None
        wall = time.perf_counter() - self.started
        return max(0.0, (busy - self.busy) - (time.process_time() - self.own)) / wall


# --- the report ------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def _growth(settings: Settings) -> str:
    return ", ".join(f"{n:,} -> {n + 2 * t:,}" for n, t in settings.appended_turns.items())


def _actions(counter: Counter[str]) -> str:
    return ", ".join(sorted(counter)) or "-"


def problems(rows: list[Row]) -> list[str]:
    """Variants that did not do what they claim: their numbers measure something else."""
    found = []
    for row in rows:
        cold = row.cold[0].actions if row.cold else Counter()
        warm = row.warm[-1].actions if row.warm else Counter()
        if row.variant.expect is None and (cold or warm):
            found.append(f"{row.variant.name} {row.messages}: rewrites happened: {_actions(cold)}")
        if row.variant.expect and row.messages == max(SIZES) and row.variant.expect not in cold:
            found.append(f"{row.variant.name} {row.messages}: no {row.variant.expect} when cold")
        if row.summarizer_warm:
            found.append(
                f"{row.variant.name} {row.messages}: the summarizer ran again on warm turns "
                f"({row.summarizer_warm} calls) instead of reusing the checkpoint"
            )
    return found


def format_report(rows: list[Row], settings: Settings, seconds: float, others: float | None) -> str:
    lines = [
        f"{'variant':<8} {'msgs':>5} {'JSON KB':>8} {'~tokens':>8} {'parse ms':>8} "
        f"{'cold ms':>8} {'warm p50':>8} {'warm p95':>8} {'appended p50':>12}"
    ]
    for row in rows:
        lines.append(
            f"{row.variant.name:<8} {row.messages:>5} {row.json_bytes / 1024:>8.1f} "
            f"{row.tokens:>8,} {_ms(statistics.median(row.parse_ms)):>8} "
            f"{_ms(row.p(row.cold, 50)):>8} {_ms(row.p(row.warm, 50)):>8} "
            f"{_ms(row.p(row.warm, 95)):>8} {_ms(row.p(row.appended, 50)):>12}"
        )
    colds = settings.passes * settings.cold_runs
    lines.append(
        "(ms per turn, rewrite only; parse = orjson.loads of the body, paid apart; cold = median "
        f"of {colds} first turns, each on a new Rewriter + LocalStore (opened before); "
        f"appended = warm, 2 new messages a turn, over {_growth(settings)}; "
        f"{settings.passes} passes pooled)"
    )
    lines.append("")
    lines.append(f"warm p50 by stage (ms) {'repair':>8} {'offload':>8} {'compact':>8} {'rest':>8}")
    for row in rows:
        lines.append(
            f"{row.variant.name:<8} {row.messages:>5} {'':>8} {_ms(row.stage_p50('repair')):>8} "
            f"{_ms(row.stage_p50('offload')):>8} {_ms(row.stage_p50('compaction')):>8} "
            f"{_ms(row.rest_p50()):>8}"
        )
    lines.append("(rest = chain pairing checks after a stage changed something, recall offer)")
    lines.append("")
    lines.append("rewrites recorded (cold turn -> warm turn):")
    for row in rows:
        cold = _actions(row.cold[0].actions) if row.cold else "-"
        warm = _actions(row.warm[-1].actions) if row.warm else "-"
        calls = ""
        if row.cold and (row.summarizer_cold or row.summarizer_warm or row.summarizer_appended):
            calls = (
                f"  [summarizer calls: {row.summarizer_cold / len(row.cold):g} per cold turn, "
                f"{row.summarizer_warm} in {len(row.warm)} warm turns, "
                f"{row.summarizer_appended} in {len(row.appended)} appended turns]"
            )
        window = "" if row.window >= 1_000_000 else f" (window {row.window:,} tokens)"
        lines.append(f"  {row.variant.name:<8} {row.messages:>5}{window}: {cold} -> {warm}{calls}")
    lines.append("")
    largest, smallest = max(SIZES), min(SIZES)
    lines.append(
        f"targets: warm p50 <= {TARGET_WARM_MS:g} ms at {largest:,} messages; flat: warm p50 at "
        f"{largest:,} / warm p50 at {smallest} <= {TARGET_FLAT_RATIO:g}x"
    )
    for variant in VARIANTS:
        by_size = {r.messages: r for r in rows if r.variant is variant}
        if largest not in by_size or smallest not in by_size:
            continue
        big = by_size[largest].p(by_size[largest].warm, 50)
        small = by_size[smallest].p(by_size[smallest].warm, 50)
        ratio = big / small if small > 0 else math.inf
        lines.append(
            f"  {'met   ' if big <= TARGET_WARM_MS else 'MISSED'}  {variant.name:<8} warm p50 "
            f"@{largest:,}: {big:.3f} ms"
        )
        lines.append(
            f"  {'met   ' if ratio <= TARGET_FLAT_RATIO else 'MISSED'}  {variant.name:<8} "
            f"warm({largest:,})/warm({smallest}): {ratio:.1f}x"
        )
    for problem in problems(rows):
        lines.append(f"!!! {problem}")
    lines.append("")
    measured = {row.variant.name for row in rows}
    lines.extend(f"  {v.name}: {v.what}" for v in VARIANTS if v.name in measured)
    lines.append(
        "  the summarizer is an instant stub returning a fixed summary: model time excluded"
    )
    if others is not None and others > BUSY_MACHINE_CPUS:
        lines.append(
            f"!!! the machine was busy: other processes used {others:.2f} CPUs on average "
            "while we measured; rerun on a quiet machine"
        )
    quiet = "" if others is None else f"; other processes used {others:.2f} CPUs"
    lines.append(
        f"({os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.machine()}; gc on; ran {seconds:.1f} s{quiet})"
    )
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer turns: a smoke test")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="then cProfile the warm turn at the largest size, for every variant",
    )
    parser.add_argument(
        "--variant",
        action="append",
        choices=[v.name for v in VARIANTS],
        help="only this variant (repeatable)",
    )
    return parser.parse_args(argv)


async def run(args: argparse.Namespace, tmp: Path) -> int:
    settings = QUICK if args.quick else FULL
    variants = [v for v in VARIANTS if not args.variant or v.name in args.variant]
    started = time.perf_counter()
    quietness = Quietness()
    full = histories(SEED, SIZES, max(settings.appended_turns.values()))
    rows: list[Row] = []
    for number in range(1, settings.passes + 1):
        print(f"pass {number} of {settings.passes}", file=sys.stderr, flush=True)
        done = iter(rows) if rows else None
        for variant in variants:
            for size in SIZES:
                row = await measure(variant, size, full[size], settings, tmp)
                if done is None:
                    rows.append(row)
                else:
                    next(done).merge(row)
    others = quietness.others_cpus()
    print(format_report(rows, settings, time.perf_counter() - started, others))
    if args.profile:
        size = max(SIZES)
        for variant in variants:
            print()
            print(await profile(variant, size, full[size], settings.warm_turns[size] // 2, tmp))
    return 1 if problems(rows) else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="agentproxy-rewrite-bench-") as tmp:
        try:
            return asyncio.run(run(args, Path(tmp)))
        except KeyboardInterrupt:
            return 130


if __name__ == "__main__":
    sys.exit(main())
