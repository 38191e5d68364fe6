"""10,000 mutated requests over real sockets: every answer is a 2xx or a 4xx with an error body
in the route's wire format, never the proxy's own 5xx, and the proxy serves normally afterwards.

Hypothesis draws the cases (tests/fuzzing.py), derandomized so CI sees the same ones every run.
One hypothesis example is a batch of BATCH cases sent 8 at a time: one request per example
would send them one by one, with hypothesis's overhead between each; a failing batch still
shrinks to the one case (and the fewest mutations) that fails. Hypothesis runs in a worker
thread and hands each batch to the event loop the servers live on.

The upstream is the simulator, which checks requests like the real API; anything it cannot read
is answered 400, as a provider does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.sim.simulator import Simulator
from tests.conftest import ProxyFactory, sim_config
from tests.fuzzing import Case, FuzzTarget, cases

KEY = "sk-fuzz"
CASES = int(os.environ.get("AGENTPROXY_FUZZ_CASES", "10000"))  # more, or fewer, locally
BATCH = 25
CONCURRENCY = 8

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    },
]
_TOOL_TURN = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "Fix the failing test."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "write_file", "arguments": '{"path": "b.py", "content": "x"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "def f():\n    return 1\n" * 40},
    {"role": "tool", "tool_call_id": "call_2", "content": "written"},
    {"role": "user", "content": [{"type": "text", "text": "Now run the tests."}]},
]
CHAT_PARAMS = (
    "model", "messages", "stream", "stream_options", "tools", "tool_choice", "max_tokens",
    "max_completion_tokens", "n", "temperature", "top_p", "stop", "seed", "logit_bias",
    "metadata", "user", "response_format", "presence_penalty", "parallel_tool_calls",
)  # fmt: skip
_CHAT_SEEDS: tuple[dict[str, Any], ...] = (
    {"model": "sim", "messages": [{"role": "user", "content": "hello there"}]},
    {"model": "sim", "messages": _TOOL_TURN, "tools": _TOOLS, "temperature": 0.2},
    {
        "model": "sim",
        "messages": _TOOL_TURN,
        "tools": _TOOLS,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 100,
    },
    {
        "model": "sim",
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Say hi.", "name": "bob"},
        ],
        "metadata": {"session_id": "fuzz-session"},
        "user": "fuzz-user",
        "n": 1,
        "tool_choice": "auto",
        "response_format": {"type": "text"},
    },
)
CHAT = FuzzTarget(
    route="/v1/chat/completions",
    # Each seed also to `claude`, the Anthropic deployment: translated by litellm, whose
    # translation must not be where a malformed field is first noticed.
    seeds=_CHAT_SEEDS + tuple({**seed, "model": "claude"} for seed in _CHAT_SEEDS),
    params=CHAT_PARAMS,
    headers={"Authorization": f"Bearer {KEY}"},
)
_ANTHROPIC_TURN = [
    {"role": "user", "content": "Fix the failing test."},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Reading it."},
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.py"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": "def f():\n    return 1\n" * 40,
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "Now run the tests."},
        ],
    },
]
_ANTHROPIC_TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
ANTHROPIC_PARAMS = (
    "model", "messages", "system", "max_tokens", "stream", "tools", "tool_choice", "metadata",
    "temperature", "top_p", "top_k", "stop_sequences", "thinking",
)  # fmt: skip


def anthropic_error_body(body: Any) -> bool:
    """{"type": "error", "error": {"type": str, "message": str}}: Anthropic's envelope."""
    error = body.get("error") if isinstance(body, dict) else None
    return (
        isinstance(body, dict)
        and body.get("type") == "error"
        and isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str)
    )


ANTHROPIC = FuzzTarget(
    route="/v1/messages",
    seeds=(
        {"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
        {
            "model": "claude",
            "max_tokens": 100,
            "system": [
                {"type": "text", "text": "Be careful.", "cache_control": {"type": "ephemeral"}}
            ],
            "messages": _ANTHROPIC_TURN,
            "tools": _ANTHROPIC_TOOLS,
        },
        {
            "model": "claude",
            "max_tokens": 100,
            "messages": _ANTHROPIC_TURN,
            "tools": _ANTHROPIC_TOOLS,
            "stream": True,
            "metadata": {"user_id": '{"session_id": "fuzz-cc"}'},
            "tool_choice": {"type": "auto"},
        },
    ),
    params=ANTHROPIC_PARAMS,
    headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
    is_error_body=anthropic_error_body,
)
_RESPONSES_INPUT = [
    {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "Be careful."}],
    },
    {"role": "user", "content": "Fix the failing test."},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA-x"},
    {
        "type": "function_call",
        "call_id": "call_1",
        "name": "read_file",
        "arguments": '{"path": "a.py"}',
    },
    {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "def f():\n    return 1\n" * 40,
    },
    {"role": "user", "content": [{"type": "input_text", "text": "Now run the tests."}]},
]
_RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
RESPONSES_PARAMS = (
    "model", "input", "instructions", "tools", "tool_choice", "stream", "store", "include",
    "max_output_tokens", "prompt_cache_key", "reasoning", "temperature", "metadata",
)  # fmt: skip
RESPONSES = FuzzTarget(
    route="/v1/responses",
    seeds=(
        {"model": "sim", "input": "hello there"},
        {"model": "sim", "input": _RESPONSES_INPUT, "tools": _RESPONSES_TOOLS, "store": False},
        {
            "model": "sim",
            "instructions": "You are Codex.",
            "input": _RESPONSES_INPUT,
            "tools": _RESPONSES_TOOLS,
            "stream": True,
            "prompt_cache_key": "fuzz-thread",
        },
    ),
    params=RESPONSES_PARAMS,
    headers={"Authorization": f"Bearer {KEY}"},
)
# Small window, low thresholds: offload, compaction and recall run on the mutated histories too.
FUZZ_CONFIG = f"""
keys:
  api_keys: [{{name: fuzzer, key: {KEY}}}]
policies:
  - name: everything
    offload: {{min_tokens: 100}}
    compaction: {{trigger: 0.5, keep_messages: 2}}
    circuit: {{session_failures: 50}}
    retry: {{attempts: 2, base_s: 0.01, cap_s: 0.02}}
    budgets: [{{name: per-session, limits: {{calls: 1000000}}}}]
"""


@web.middleware
async def garbage_is_400(request: web.Request, handler: Any) -> web.StreamResponse:
    """A provider answers what it cannot read with a 400, whatever the simulator makes of it."""
    try:
        response: web.StreamResponse = await handler(request)
    except web.HTTPException:
        raise
    except Exception as exc:
        message = f"upstream could not read the request: {type(exc).__name__}"
        body = {"error": {"message": message, "type": "invalid_request_error"}}
        return web.json_response(body, status=400)
    return response


class ErrorLog(logging.Handler):
    """The proxy's ERROR records: a crash that fail-safe code swallowed is still a finding."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = f"{record.name}: {record.getMessage()[:200]}"
        if record.exc_info and record.exc_info[1] is not None:
            error, trace = record.exc_info[1], traceback.extract_tb(record.exc_info[2])
            where = f"{trace[-1].filename}:{trace[-1].lineno}" if trace else "?"
            line += f" [{type(error).__name__}: {str(error)[:100]} at {where}]"
        self.lines.append(line)

    def summary(self) -> str:
        kinds = Counter(re.sub(r"request \w+", "request <id>", line) for line in self.lines)
        return "\n".join(f"{n} x {line}" for line, n in kinds.most_common())


@pytest.fixture
def error_log() -> Iterator[ErrorLog]:
    handler = ErrorLog()
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)


async def fuzz_proxy(start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path) -> str:
    sim = Simulator(context_window=4096, record=False)
    sim_app = sim.app()
    sim_app.middlewares.append(garbage_is_400)
    upstream: TestServer = await aiohttp_server(sim_app)
    path = tmp_path / "fuzz.yaml"
    url = str(upstream.make_url("")).rstrip("/")
    # An Anthropic deployment too, after the list's first entry ("sim", OpenAI-compatible).
    claude = (
        "\n  - model_name: claude\n    litellm_params:\n      model: anthropic/claude-sim\n"
        f"      api_base: {url}\n      api_key: sk-sim-upstream-secret\n"
        "    model_info:\n      max_input_tokens: 4096\n"
    )
    text = sim_config(url, window=4096).rstrip("\n") + claude
    path.write_text(f"{text}store: {{path: {tmp_path}}}\n{FUZZ_CONFIG}")
    proxy = await start_proxy(path)
    return str(proxy.make_url(""))


async def answer_problem(
    http: aiohttp.ClientSession,
    url: str,
    target: FuzzTarget,
    body: bytes,
    statuses: Counter[int],
) -> str | None:
    """What is wrong with the proxy's answer to `body`, or None."""
    headers = {**target.headers, "Content-Type": "application/json"}
    try:
        async with http.post(url, data=body, headers=headers) as r:
            data = await r.read()
            status = r.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"no answer: {type(exc).__name__}: {exc}"
    statuses[status] += 1
    if 200 <= status < 300:
        # A stream that failed after it began ends with an error event: never the proxy's own.
        if b'"internal_error"' in data:
            return f"status {status} carrying an internal error: {data[-300:]!r}"
        return None
    if not 400 <= status < 500:
        return f"status {status}: {data[:300]!r}"
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        parsed = None
    if not target.is_error_body(parsed):
        return f"status {status} without an error body in the route's shape: {data[:300]!r}"
    return None


async def send_all(
    http: aiohttp.ClientSession,
    url: str,
    batch: list[Case],
    target: FuzzTarget,
    statuses: Counter[int],
) -> list[str]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(case: Case) -> str | None:
        body = case.body(target)
        async with gate:
            problem = await answer_problem(http, url, target, body, statuses)
        return f"{problem}\n  case {case}\n  body {body[:300]!r}" if problem else None

    found = await asyncio.gather(*(one(case) for case in batch))
    return [problem for problem in found if problem]


TARGETS = [CHAT, ANTHROPIC, RESPONSES]


@pytest.mark.parametrize("target", TARGETS, ids=[t.route for t in TARGETS])
async def test_fuzzed_requests_get_2xx_or_a_4xx_error_body(
    start_proxy: ProxyFactory,
    aiohttp_server: Any,
    tmp_path: Path,
    error_log: ErrorLog,
    target: FuzzTarget,
) -> None:
    base = await fuzz_proxy(start_proxy, aiohttp_server, tmp_path)
    url = base.rstrip("/") + target.route
    timeout = aiohttp.ClientTimeout(total=30)
    sent = 0
    statuses: Counter[int] = Counter()
    started = time.perf_counter()
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=CONCURRENCY)
    ) as http:
        loop = asyncio.get_running_loop()

        def run(coro: Any) -> Any:
            """From hypothesis's thread, on the loop the servers live on."""
            return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=300)

        @settings(
            max_examples=CASES // BATCH,
            derandomize=True,  # the same cases on every run, everywhere
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.lists(cases(target), min_size=BATCH, max_size=BATCH))
        def batch_is_answered_well(batch: list[Case]) -> None:
            nonlocal sent
            sent += len(batch)
            problems = run(send_all(http, url, batch, target, statuses))
            assert not problems, "\n".join(problems[:3])

        await asyncio.to_thread(batch_is_answered_well)
        assert sent >= CASES
        elapsed = time.perf_counter() - started
        async with http.post(url, json=target.seeds[0], headers=target.headers) as r:
            assert r.status == 200, await r.text()
    logging.getLogger("tests.fuzz").info(
        "%d fuzzed requests in %.1f s: %s", sent, elapsed, sorted(statuses.items())
    )
    assert not error_log.lines, error_log.summary()
