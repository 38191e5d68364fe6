"""Load and soak: many simulated tool-calling agents through the proxy, for a fixed time.

Starts the simulated upstream (`python -m proxy simulate`) and the proxy (`python -m proxy
serve`), each as its own process so the proxy's memory can be read from /proc, with a temporary
configuration built to exercise everything at once: a small-window alias (offload of large tool
results, compaction with summaries, truncation of old write_file arguments, recall), a fallback
alias, retries, circuits, loop detection and generous budgets. N agents then run tool-calling
loops, each in its own session (`x-agentproxy-session`), half streaming, while a background task
injects faults into the simulator (429 with Retry-After, 503, resets, slow answers, garbled
bodies, cut streams) and clears what the simulator records.

    python bench/load.py --agents 50 --seconds 600                    # the soak (local store)
    python bench/load.py --seconds 1800 --warmup 600 --cooldown 120   # issue 13's flat-memory soak
    python bench/load.py --agents 5 --seconds 20                      # smoke test
    python bench/load.py --store redis --redis-url redis://127.0.0.1:6379/0
    python bench/load.py --faults garbled --fault-rate 3 --seconds 60  # one kind of fault
    python bench/load.py --keep ...        # keep the temp folder: config, logs, store
    python bench/load.py --heaptrack --seconds 900 --warmup 300  # every malloc and free
    python bench/load.py --memo-idle-s 600 --glibc-threshold ...  # the defaults before 2026-12-03
    python bench/load.py --proxy-env MALLOC_ARENA_MAX=2 ...  # the proxy's allocator

Prints a progress line every 30 s (elapsed, requests, rps, errors, proxy RSS, its memos' size from
/metrics and the resident part of glibc's main heap, where fragmentation shows) and a summary:
throughput, latency percentiles (JSON and streaming apart), errors by class with an example body
each, the proxy's RSS right after start, after warm-up and at the end with its growth per minute
after warm-up, its idle RSS once the traffic has stopped (`--cooldown` seconds later), the RSS
timeline, and the proxy's own /metrics counters for rewrites, retries, fallbacks and memo sizes.
The proxy is this checkout's (PYTHONPATH = the repository root), run with the project's virtualenv.

Traffic goes to 127.0.0.1 only; the run is bounded (at most 3600 s and 500 agents); every
process started here is stopped on exit, Ctrl-C included (one Ctrl-C ends the run early and
still prints the summary). With `--store redis` the keys written under the run's own prefix are
deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import math
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
import orjson
from _load import check_loopback, percentile
from _payloads import string_tool
from overhead import Processes, cpu_s, free_port, rss_mb

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
CHAT_PATH = "/v1/chat/completions"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

MAX_SECONDS = 3600.0
MAX_AGENTS = 500
READY_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 120.0
RSS_SAMPLE_S = 5.0
CLEAR_SIM_EVERY_S = 10.0  # the simulator keeps every request it saw until cleared

PRIMARY = "load-8k"  # small window: offload, compaction and summaries happen all the time
FALLBACK = "load-16k"
PRIMARY_WINDOW = 8192
FALLBACK_WINDOW = 16384
SIM_WINDOW = 16384  # the simulator enforces one window for every model: the larger one

# Per session: a new one after this many tasks (or MAX_HISTORY_CHARS), so the proxy's
# per-session state keeps turning over and memory shows its steady state, not one session.
TASKS_PER_SESSION = (12, 36)
MAX_HISTORY_CHARS = 1_500_000
DETAIL_CHARS = 600  # of an error body kept as an example per error class
CLIENT_ATTEMPTS = 3  # an agent's own tries of one request (connection errors, plain 5xx)


# --- configuration ---------------------------------------------------------------------------


def config_text(
    sim_port: int,
    state: Path,
    store: str,
    redis_url: str,
    prefix: str,
    memo_mb: int | None,
    store_mb: int | None = None,
    max_rss_mb: int | None = None,
    memo_idle_s: float | None = None,
    glibc_threshold: bool = False,
) -> str:
    api_base = f"http://127.0.0.1:{sim_port}/v1"
    if store == "redis":
        # `path` still holds the event log; the state itself goes to Redis.
        fields = f"backend: redis, url: '{redis_url}', prefix: '{prefix}', path: '{state}'"
    else:
        fields = f"backend: local, path: '{state}'"
    cap = "" if store_mb is None else f", max_mb: {store_mb}"
    store_yaml = f"{{{fields}{cap}}}"
    memo = "" if memo_mb is None else f"\n          memo_mb: {memo_mb}"  # dedented below
    if max_rss_mb is not None:
        memo += f"\n          max_rss_mb: {max_rss_mb}"
    if memo_idle_s is not None:
        memo += f"\n          memo_idle_s: {memo_idle_s}"
    if glibc_threshold:
        memo += "\n          mmap_threshold_kb: null"
    return textwrap.dedent(
        f"""\
        server:
          read_timeout_s: 30
          watch_interval_s: 5{memo}
        store: {store_yaml}
        model_list:
          - model_name: {PRIMARY}
            litellm_params: {{model: openai/{PRIMARY}, api_base: '{api_base}', timeout: 30}}
            model_info: {{max_input_tokens: {PRIMARY_WINDOW}, max_output_tokens: 1024}}
          - model_name: {FALLBACK}
            litellm_params: {{model: openai/{FALLBACK}, api_base: '{api_base}', timeout: 30}}
            model_info: {{max_input_tokens: {FALLBACK_WINDOW}, max_output_tokens: 1024}}
        policies:
          - name: load
            description: bench/load.py's agents; thresholds low so every stage works
            match: {{models: [{PRIMARY}, {FALLBACK}]}}
            offload: {{min_tokens: 2000, preview_lines: 3}}
            compaction: {{trigger: 0.8, keep_recent: 0.15, summarizer_timeout_s: 10}}
            recall: {{max_rounds: 2}}
            retry: {{attempts: 3, base_s: 0.1, cap_s: 1, retry_after_cap_s: 5, deadline_s: 60}}
            fallbacks:
              - {{from: {PRIMARY}, to: [{FALLBACK}], when: [transient, overflow]}}
            circuit: {{failures: 10, cooldown_s: 5}}
            loops: {{window: 5, repeats: 3, ladder: [warn, no_tools, block]}}
            budgets:
              - {{name: per-session, limits: {{tokens: 100000000, calls: 100000}}}}
              - {{name: global-minute, scope: global, window: minute, limits: {{calls: 10000000}}}}
        """
    )


# --- processes -------------------------------------------------------------------------------


def _http_status(port: int, path: str) -> int | None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    except OSError:
        return None
    finally:
        connection.close()


def wait_http(child: subprocess.Popen[bytes], port: int, path: str, log: Path) -> float:
    """Seconds until GET `path` answers 200 (the child must stay alive meanwhile)."""
    started = time.perf_counter()
    while time.perf_counter() - started < READY_TIMEOUT_S:
        if child.poll() is not None:
            raise RuntimeError(f"{child.args!r} exited with {child.returncode}:\n{_tail(log)}")
        if _http_status(port, path) == 200:
            return time.perf_counter() - started
        time.sleep(0.02)
    raise RuntimeError(f"{child.args!r} not ready within {READY_TIMEOUT_S:g} s:\n{_tail(log)}")


def _tail(log: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


def _env(extra: list[str] | None = None) -> dict[str, str]:
    """This process's environment for a child, with `extra` NAME=VALUE items on top."""
    added = dict(item.split("=", 1) for item in extra or [])
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), **added}


@dataclass(slots=True)
class Child:
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    traced: int | None = None  # under heaptrack: the Python process its script started

    @property
    def pid(self) -> int:
        """The process measured: the proxy itself, not a wrapper around it."""
        return self.process.pid if self.traced is None else self.traced


def start_child(
    procs: Processes,
    args: list[str],
    port: int,
    log: Path,
    ready: str,
    wrap: list[str] | None = None,
    env: list[str] | None = None,
) -> Child:
    command = [*(wrap or []), sys.executable, "-m", "proxy", *args, "--port", str(port)]
    with log.open("wb") as out:
        child = procs.spawn(command, env=_env(env), cwd=log.parent, stdout=out, stderr=out)
    wait_http(child, port, ready, log)
    return Child(child, port, log, _python_child(child.pid) if wrap else None)


def _python_child(parent: int) -> int:
    """The Python process a wrapper script (heaptrack's) started: measured in its stead."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            text = stat.read_text()
            fields = text[text.rindex(")") + 2 :].split()
            if int(fields[1]) == parent and "python" in text[text.index("(") : text.rindex(")")]:
                return int(stat.parent.name)
    raise RuntimeError(f"no Python process under the wrapper (pid {parent})")


def heaptrack_command(workdir: Path) -> list[str]:
    """The proxy run under heaptrack (Debian's `heaptrack`), from its start: every malloc and
    free with its stack, for `heaptrack_print` after the run."""
    return ["heaptrack", "-o", str(workdir / "heaptrack.proxy")]


def stop_traced(proxy: Child, timeout_s: float = 300) -> str:
    """End the proxy under heaptrack gracefully, so heaptrack writes its file; where it is."""
    if proxy.traced is not None and proxy.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proxy.traced, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proxy.process.wait(timeout=timeout_s)  # the script waits for heaptrack's writer
    found = sorted(proxy.log.parent.glob("heaptrack.proxy*"))
    if not found:
        return "!!! heaptrack wrote no file"
    return f"heaptrack: {found[0]} (read it with: heaptrack_print -f {found[0]})"


def validate(config: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "validate", str(config)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the generated config is invalid:\n{done.stdout}{done.stderr}")


# --- Redis (a few raw RESP commands: no client library needed) ------------------------------


class Redis:
    """Just enough RESP2 for PING, INFO, SCAN and DEL on a loopback Redis."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "redis" or parts.hostname not in LOOPBACK_HOSTS:
            raise ValueError(f"--redis-url must be redis:// on loopback, not {url!r}")
        self._sock = socket.create_connection((parts.hostname, parts.port or 6379), timeout=5)
        self._file = self._sock.makefile("rb")
        if parts.password:
            user = [unquote(parts.username)] if parts.username else []
            self.command("AUTH", *user, unquote(parts.password))
        db = parts.path.strip("/")
        if db and db != "0":
            self.command("SELECT", db)

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def command(self, *args: str | bytes) -> Any:
        out = [f"*{len(args)}\r\n".encode()]
        for arg in args:
            data = arg.encode() if isinstance(arg, str) else arg
            out += [f"${len(data)}\r\n".encode(), data, b"\r\n"]
        self._sock.sendall(b"".join(out))
        return self._reply()

    def _reply(self) -> Any:
        line = self._file.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(f"redis: {rest.decode()}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self._file.read(size + 2)[:-2]
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self._reply() for _ in range(size)]
        raise RuntimeError(f"redis: unexpected reply {line!r}")

    def used_memory_mb(self) -> float:
        info = self.command("INFO", "memory").decode()
        match = re.search(r"^used_memory:(\d+)", info, re.MULTILINE)
        return int(match.group(1)) / 2**20 if match else math.nan

    def keys(self, prefix: str) -> Iterator[bytes]:
        cursor = b"0"
        pattern = _glob_escape(prefix) + "*"
        while True:
            cursor, found = self.command("SCAN", cursor, "MATCH", pattern, "COUNT", "1000")
            yield from found
            if cursor == b"0":
                return

    def delete_prefix(self, prefix: str) -> int:
        keys = list(self.keys(prefix))
        deleted = 0
        for start in range(0, len(keys), 500):
            deleted += int(self.command("DEL", *keys[start : start + 500]))
        return deleted


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


# --- what the agents send --------------------------------------------------------------------


TOOLS = [
    string_tool("read_file", "Read a file of the repository.", path="file path"),
    string_tool("run_shell", "Run a shell command; returns its output.", command="command line"),
    string_tool("search_code", "Search the code for a pattern.", pattern="regular expression"),
    string_tool("list_dir", "List a folder.", path="folder path"),
    string_tool("write_file", "Write a file.", path="file path", content="the new text"),
]
SYSTEM_PROMPT = (
    "You are a coding agent working in a git repository. Use the tools to inspect files, run "
    "the tests and fix what fails. Keep changes small and report what you observed. " * 4
)
PATHS = [f"src/module_{i}.py" for i in range(40)] + [f"tests/test_{i}.py" for i in range(20)]


def _corpus() -> str:
    """~200 KB of log-like lines (a few ERRORs for recall searches), the same every run."""
    rng = random.Random(7)
    lines = []
    for i in range(2600):
        level = "ERROR" if i % 97 == 13 else rng.choice(["INFO", "INFO", "DEBUG", "WARN"])
        lines.append(
            f"2026-11-30 10:{i // 60 % 60:02d}:{i % 60:02d} {level} worker-{rng.randrange(16)} "
            f"handled job {rng.randrange(10**6)} in {rng.randrange(1, 900)} ms "
            f"path={rng.choice(PATHS)}"
        )
    return "\n".join(lines) + "\n"


CORPUS = _corpus()


def text_of_size(rng: random.Random, size: int, tag: str) -> str:
    start = rng.randrange(0, len(CORPUS) - size)
    return f"# {tag}\n{CORPUS[start : start + size]}"


# (kind, weight): what one task of an agent asks the model to do.
TASK_KINDS: list[tuple[str, int]] = [
    ("read_small", 25),
    ("read_medium", 20),
    ("shell_big", 10),
    ("read_big", 5),
    ("search", 13),
    ("list_dir", 5),
    ("write_file", 10),
    ("loop", 3),
    ("recall", 7),
]
RESULT_SIZES = {"small": (200, 1_500), "medium": (2_500, 7_000), "big": (30_000, 100_000)}


@dataclass(slots=True)
class Task:
    user: str  # the user message, naming the tool call the simulator will make
    result_size: str  # size class of the tool's result: small, medium, big


def plan_tasks(rng: random.Random, number: int, has_offloaded: bool) -> list[Task]:
    """One task, or several for a loop (the same call 3-4 times in a row)."""
    kinds, weights = zip(*TASK_KINDS, strict=True)
    kind = rng.choices(kinds, weights)[0]
    path = rng.choice(PATHS)
    step = f"Step {number}:"
    if kind == "recall" and not has_offloaded:
        kind = "read_small"
    if kind == "recall":
        return [Task(f'{step} what failed earlier? agentproxy_recall({{"query": "ERROR"}})', "")]
    if kind == "loop":
        call = f'read_file({{"path": "{path}"}})'
        return [Task(f"{step} check again {call}", "small")] * rng.choice((3, 4))
    if kind in ("read_small", "read_medium", "read_big"):
        return [Task(f'{step} look at read_file({{"path": "{path}"}})', kind.split("_")[1])]
    if kind == "shell_big":
        command = orjson.dumps({"command": f"pytest -x {path} -vv"}).decode()
        return [Task(f"{step} run the tests run_shell({command})", "big")]
    if kind == "search":
        pattern = f"def helper_{rng.randrange(100)}"
        return [Task(f'{step} find it search_code({{"pattern": "{pattern}"}})', "small")]
    if kind == "list_dir":
        return [Task(f'{step} what is there? list_dir({{"path": "src"}})', "small")]
    # write_file: long arguments, which compaction truncates once they are old.
    content = text_of_size(rng, rng.randrange(2_500, 6_000), f"new version of {path}")
    arguments = orjson.dumps({"path": path, "content": content}).decode()
    return [Task(f"{step} save the fix write_file({arguments})", "small")]


def tool_result(rng: random.Random, name: str, arguments: str, size_class: str) -> str:
    if name == "write_file":
        return f"wrote {len(arguments)} bytes"
    low, high = RESULT_SIZES.get(size_class or "small", RESULT_SIZES["small"])
    return text_of_size(rng, rng.randrange(low, high), f"{name} {arguments[:80]}")


# --- one request -----------------------------------------------------------------------------


@dataclass(slots=True)
class Answer:
    message: dict[str, Any] | None  # the assistant message; None on failure
    error: str | None = None  # its class, e.g. "HTTP 503 upstream_error/http_503"
    retry_after: float | None = None
    should_retry: bool = True  # false when the proxy says so (x-should-retry: false)
    latency_s: float = 0.0
    ttfb_s: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    detail: str = ""  # the start of the error body or event, for the report


def _error_class(status: int, raw: bytes) -> str:
    try:
        error = orjson.loads(raw).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return f"HTTP {status} (non-JSON body)"
    if not isinstance(error, dict):
        return f"HTTP {status} (odd error body)"
    return f"HTTP {status} {error.get('type')}/{error.get('code')}"


def _detail(raw: bytes) -> str:
    return " ".join(raw[:DETAIL_CHARS].decode("utf-8", "replace").split())


def _retry_after(headers: Any) -> float | None:
    with contextlib.suppress(TypeError, ValueError):
        return float(headers.get("retry-after"))
    return None


async def post_chat(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], session: str
) -> Answer:
    stream = bool(body.get("stream"))
    sent = time.perf_counter()
    headers = {"x-agentproxy-session": session, "content-type": "application/json"}
    try:
        async with http.post(url, data=orjson.dumps(body), headers=headers) as response:
            kept = {k.lower(): v for k, v in response.headers.items() if k.lower().startswith("x-")}
            if response.status != 200:
                raw = await response.read()
                return Answer(
                    None,
                    _error_class(response.status, raw),
                    _retry_after(response.headers),
                    kept.get("x-should-retry") != "false",
                    headers=kept,
                    detail=_detail(raw),
                )
            if stream:
                answer = await _read_stream(response, sent)
            else:
                answer = _read_json(await response.read())
    except (TimeoutError, aiohttp.ClientError) as exc:
        return Answer(None, f"connection: {type(exc).__name__}", detail=str(exc))
    answer.latency_s = time.perf_counter() - sent
    answer.headers = kept
    return answer


def _read_json(raw: bytes) -> Answer:
    try:
        message = orjson.loads(raw)["choices"][0]["message"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return Answer(None, "bad JSON answer")
    return Answer(_clean(message))


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    """What an agent keeps of an answer (the SDKs drop nulls and extras the same way)."""
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": c["function"]}
            for c in message["tool_calls"]
        ]
    return kept


async def _read_stream(response: aiohttp.ClientResponse, sent: float) -> Answer:
    first: float | None = None
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    done = False
    async for line in response.content:
        if first is None:
            first = time.perf_counter() - sent
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            # Read on to the end of the body: leaving now would close the connection under
            # the proxy's final write, which it counts as a client gone away (499).
            done = True
            continue
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return Answer(None, "stream: garbled event")
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {}
            return Answer(
                None,
                f"stream error event {error.get('type')}/{error.get('code')}",
                detail=_detail(payload),
            )
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    part.get("index", 0),
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
    if not done:
        return Answer(None, "stream: ended without [DONE]")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return Answer(message, ttfb_s=first)


# --- the run's shared state ------------------------------------------------------------------


@dataclass(slots=True)
class Stats:
    started: float
    requests: int = 0  # every request sent that got an answer or an error
    ok: int = 0
    turns: int = 0  # tasks completed: user message, tool call, tool result, answer
    sessions: int = 0
    abandoned: int = 0  # sessions given up after an error the agent could not retry
    errors: Counter[str] = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"json": [], "stream": []})
    ttfbs: list[float] = field(default_factory=list)
    applied: Counter[str] = field(default_factory=Counter)
    models: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # error class -> first error body

    def record(self, answer: Answer, stream: bool) -> None:
        self.requests += 1
        if answer.message is None:
            self.errors[answer.error or "unknown"] += 1
            self.examples.setdefault(answer.error or "unknown", answer.detail)
        else:
            self.ok += 1
            self.latencies["stream" if stream else "json"].append(answer.latency_s)
            if answer.ttfb_s is not None:
                self.ttfbs.append(answer.ttfb_s)
            self.models[answer.headers.get("x-agentproxy-model", "?")] += 1
        for item in answer.headers.get("x-agentproxy-applied", "").split(","):
            if name := item.strip().split(";")[0]:
                self.applied[name] += 1


@dataclass(slots=True)
class Run:
    http: aiohttp.ClientSession
    url: str
    run_id: str
    stream_share: float
    think_s: float
    seed: int
    stats: Stats
    stop: asyncio.Event = field(default_factory=asyncio.Event)


# --- agents ----------------------------------------------------------------------------------


async def agent(run: Run, index: int) -> None:
    rng = random.Random(run.seed * 100_003 + index)
    number = 0
    while not run.stop.is_set():
        number += 1
        await agent_session(run, rng, f"load-{run.run_id}-a{index}-s{number}")


async def agent_session(run: Run, rng: random.Random, session: str) -> None:
    """One conversation: tasks until its length is reached, then the agent starts afresh."""
    run.stats.sessions += 1
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    chars = len(SYSTEM_PROMPT)
    has_offloaded = False
    pending: list[Task] = []
    for number in range(1, rng.randint(*TASKS_PER_SESSION) + 1):
        if run.stop.is_set() or chars > MAX_HISTORY_CHARS:
            return
        if not pending:
            pending = plan_tasks(rng, number, has_offloaded)
        task = pending.pop(0)
        history.append({"role": "user", "content": task.user})
        chars += len(task.user)
        # The model answers a user task with a tool call, and the tool's result with text.
        for _ in range(3):
            message = await ask(run, rng, session, history)
            if message is None:
                run.stats.abandoned += 1
                return
            history.append(message)
            chars += len(message.get("content") or "")
            calls = message.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                function = call["function"]
                result = tool_result(rng, function["name"], function["arguments"], task.result_size)
                has_offloaded = has_offloaded or len(result) >= RESULT_SIZES["big"][0]
                history.append({"role": "tool", "tool_call_id": call["id"], "content": result})
                chars += len(function["arguments"]) + len(result)
            await asyncio.sleep(rng.uniform(0, 2 * run.think_s))  # the tool "runs"
        run.stats.turns += 1


async def ask(
    run: Run, rng: random.Random, session: str, history: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """One model call as an SDK would make it: a few tries, unless told not to retry."""
    for attempt in range(CLIENT_ATTEMPTS):
        stream = rng.random() < run.stream_share
        body: dict[str, Any] = {"model": PRIMARY, "messages": history, "tools": TOOLS}
        if stream:
            body["stream"] = True
            if rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
        if rng.random() < 0.3:
            body["max_tokens"] = 512
        answer = await post_chat(run.http, run.url, body, session)
        if run.stop.is_set():
            return None  # answers finishing after the deadline are not counted
        run.stats.record(answer, stream)
        if answer.message is not None:
            return answer.message
        if not answer.should_retry or attempt == CLIENT_ATTEMPTS - 1:
            return None
        await asyncio.sleep(min(answer.retry_after or 0.2 * 2**attempt, 5.0))
    return None


# --- faults and the simulator's memory -------------------------------------------------------

# key: (description, weight, Fault fields for POST /sim/faults)
FAULTS: dict[str, tuple[str, int, dict[str, Any]]] = {
    "429": ("429 retry-after 1s", 3, {"status": 429, "retry_after": 1}),
    "429-long": ("429 retry-after 30s (over cap)", 1, {"status": 429, "retry_after": 30}),
    "503": ("503", 3, {"status": 503}),
    # Three in a row for the primary: some request may run out of retries and fall back.
    "503x3": (f"503 x3 on {PRIMARY}", 2, {"status": 503, "times": 3, "model": PRIMARY}),
    "reset": ("connection reset", 2, {"reset": True}),
    "slow": ("slow 2s", 2, {"delay_s": 2.0}),
    "garbled": ("garbled body", 1, {"malformed": True}),
    "cut": ("stream cut after 3 chunks", 1, {"cut_after_chunks": 3}),
}


async def chaos(run: Run, sim_url: str, rate: float, kinds: list[str]) -> None:
    """Injects faults at about `rate` per second and clears the simulator's request log
    (which also drops unconsumed faults, so it happens right before an injection)."""
    rng = random.Random(run.seed)
    names, weights, faults = zip(*(FAULTS[kind] for kind in kinds), strict=True)
    last_clear = time.perf_counter()
    while not run.stop.is_set():
        wait = rng.expovariate(rate) if rate > 0 else CLEAR_SIM_EVERY_S
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.stop.wait(), min(wait, CLEAR_SIM_EVERY_S))
        if run.stop.is_set():
            return
        try:
            if time.perf_counter() - last_clear >= CLEAR_SIM_EVERY_S:
                async with run.http.delete(f"{sim_url}/sim/requests") as response:
                    response.raise_for_status()
                last_clear = time.perf_counter()
            if rate > 0:
                pick = rng.choices(range(len(names)), weights)[0]
                async with run.http.post(f"{sim_url}/sim/faults", json=faults[pick]) as response:
                    response.raise_for_status()
                run.stats.faults[names[pick]] += 1
        except (TimeoutError, aiohttp.ClientError) as exc:
            print(f"chaos: simulator control call failed: {exc}", file=sys.stderr, flush=True)


# --- memory sampling and progress ------------------------------------------------------------


@dataclass(slots=True)
class Sample:
    t: float  # seconds since the load started
    proxy_mb: float
    sim_mb: float
    requests: int
    memo_mb: float = math.nan  # the proxy's own estimate of its warm-turn memos (/metrics)
    heap_mb: float = math.nan  # resident in glibc's main heap ([heap]): where fragmentation shows


def _children(pid: int) -> list[int]:
    """A proxy with `server.max_rss_mb` (or --workers) is a parent and its workers."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _rss_or_nan(pid: int) -> float:
    """The process's resident size with its children's (a worker gone between the listing
    and the read, being replaced, counts nothing)."""
    try:
        own = rss_mb(pid)
    except (OSError, RuntimeError):
        return math.nan
    children = (_rss_or_nan(child) for child in _children(pid))
    return own + sum(mb for mb in children if not math.isnan(mb))


def heap_mb(pid: int) -> float:
    """The resident size of the main C heap (`[heap]` in smaps) of the process and its
    children: the part of RSS that glibc's fragmentation grows (nan when unreadable)."""
    found = 0.0
    try:
        with open(f"/proc/{pid}/smaps") as smaps:
            in_heap = False
            for line in smaps:
                if line.endswith("[heap]\n"):
                    in_heap = True
                elif in_heap and line.startswith("Rss:"):
                    found = int(line.split()[1]) / 1024
                    break
    except OSError:
        return math.nan
    children = (heap_mb(child) for child in _children(pid))
    return found + sum(mb for mb in children if not math.isnan(mb))


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of the process, its running children and the children it has reaped
    (recycled workers)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    reaped = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime
    return cpu_s(pid) + reaped + sum(tree_cpu_s(child) for child in _children(pid))


async def sampler(
    run: Run, proxy: Child, sim: Child, samples: list[Sample], progress_s: float
) -> None:
    stats = run.stats
    next_progress = progress_s
    last_requests, last_t = 0, 0.0
    while not run.stop.is_set():
        t = time.perf_counter() - stats.started
        samples.append(Sample(t, _rss_or_nan(proxy.pid), _rss_or_nan(sim.pid), stats.requests))
        if t >= next_progress:
            samples[-1].memo_mb = memo_mb(parse_metrics(await scrape(run.http, proxy.port)))
            samples[-1].heap_mb = heap_mb(proxy.pid)
            rps = (stats.requests - last_requests) / max(t - last_t, 1e-9)
            errors = sum(stats.errors.values())
            print(
                f"[{t:6.0f} s] requests {stats.requests:,} ({rps:.1f}/s), turns {stats.turns:,}, "
                f"sessions {stats.sessions:,}, errors {errors:,}, "
                f"proxy RSS {samples[-1].proxy_mb:.1f} MB (memos {samples[-1].memo_mb:.1f} MB, "
                f"C heap {samples[-1].heap_mb:.1f} MB), "
                f"simulator RSS {samples[-1].sim_mb:.1f} MB",
                flush=True,
            )
            last_requests, last_t = stats.requests, t
            next_progress += progress_s
        if proxy.process.poll() is not None:
            print(f"!!! the proxy exited with {proxy.process.returncode}", flush=True)
            run.stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.stop.wait(), RSS_SAMPLE_S)


# --- /metrics --------------------------------------------------------------------------------

METRIC_LINE = re.compile(r"^(\w+?)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
REPORTED_METRICS = (
    "agentproxy_rewrites_total",
    "agentproxy_tokens_saved_total",
    "agentproxy_summarizer_duration_seconds_count",
    "agentproxy_retries_total",
    "agentproxy_fallbacks_total",
    "agentproxy_upstream_errors_total",
    "agentproxy_circuit_transitions_total",
    "agentproxy_requests_total",
    "agentproxy_store_errors_total",
    "agentproxy_store_writes_total",
    "agentproxy_memo_bytes",
    "agentproxy_memo_capacity_bytes",
)


def parse_metrics(text: str) -> dict[str, list[tuple[str, float]]]:
    """{metric: [("name=value ...", value)]} for the REPORTED_METRICS."""
    found: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        match = METRIC_LINE.match(line)
        if not match or match.group(1) not in REPORTED_METRICS:
            continue
        labels = " ".join(f"{k}={v}" for k, v in LABEL.findall(match.group(2) or ""))
        with contextlib.suppress(ValueError):
            found.setdefault(match.group(1), []).append((labels or "-", float(match.group(3))))
    return found


def memo_mb(metrics: dict[str, list[tuple[str, float]]]) -> float:
    rows = metrics.get("agentproxy_memo_bytes")
    return sum(value for _, value in rows) / 2**20 if rows else math.nan


async def scrape(http: aiohttp.ClientSession, proxy_port: int) -> str:
    try:
        async with http.get(f"http://127.0.0.1:{proxy_port}/metrics") as response:
            return await response.text()
    except (TimeoutError, aiohttp.ClientError) as exc:
        return f"# scrape failed: {exc}"


# --- report ----------------------------------------------------------------------------------


def slope_mb_per_min(points: list[Sample]) -> float:
    """Least-squares slope of the proxy's RSS over time."""
    points = [p for p in points if not math.isnan(p.proxy_mb)]
    if len(points) < 2:
        return math.nan
    mean_t = sum(p.t for p in points) / len(points)
    mean_m = sum(p.proxy_mb for p in points) / len(points)
    var = sum((p.t - mean_t) ** 2 for p in points)
    cov = sum((p.t - mean_t) * (p.proxy_mb - mean_m) for p in points)
    return cov / var * 60 if var else math.nan


def _sample_at(samples: list[Sample], t: float) -> Sample:
    return next((s for s in samples if s.t >= t), samples[-1])


@dataclass(slots=True)
class Outcome:
    args: argparse.Namespace
    stats: Stats
    elapsed_s: float
    samples: list[Sample]
    start_rss_mb: float  # right after the proxy was ready, before any load
    proxy_cpu_s: float
    metrics: str
    idle: list[Sample]  # after the traffic stopped, t from then
    notes: list[str] = field(default_factory=list)


def _pcts(values: list[float]) -> str:
    ordered = sorted(values)
    cells = [percentile(ordered, p) * 1000 for p in (50, 95, 99)] + [
        (ordered[-1] * 1000) if ordered else math.nan
    ]
    return f"{len(ordered):>8,} " + " ".join(f"{c:>9.1f}" for c in cells)


def _idle_line(idle: list[Sample], warm: Sample) -> list[str]:
    if not idle:
        return []
    last = idle[-1]
    return [
        f"idle after the traffic: {last.proxy_mb:.1f} MB at +{last.t:.0f} s "
        f"({100 * last.proxy_mb / warm.proxy_mb:.0f} % of the post-warm-up RSS; "
        f"memos {last.memo_mb:.1f} MB)"
    ]


def report(o: Outcome) -> str:
    s, args = o.stats, o.args
    lines = [
        "",
        f"=== AgentProxy load: {args.agents} agents, {o.elapsed_s:.0f} s, store {args.store}, "
        f"{os.cpu_count()} CPUs (shared with the simulator and this client) ===",
        f"throughput  {s.requests:,} requests = {s.requests / o.elapsed_s:.1f} req/s "
        f"({s.ok:,} ok); {s.turns:,} turns = {s.turns / o.elapsed_s:.1f}/s; "
        f"{s.sessions:,} sessions ({s.abandoned:,} abandoned after errors)",
        f"latency ms  {'n':>8} {'p50':>9} {'p95':>9} {'p99':>9} {'max':>9}",
        f"  json      {_pcts(s.latencies['json'])}",
        f"  stream    {_pcts(s.latencies['stream'])}   (until the last byte)",
        f"  stream 1st{_pcts(s.ttfbs)}   (first byte)",
    ]
    errors = sum(s.errors.values())
    share = 100 * errors / s.requests if s.requests else 0.0
    lines.append(f"errors      {errors:,} of {s.requests:,} requests ({share:.2f} %)")
    for name, n in s.errors.most_common():
        lines.append(f"  {n:>7,}  {name}")
        if example := s.examples.get(name):
            lines.append(f"           e.g. {example}")
    lines.append(f"faults injected into the simulator: {sum(s.faults.values()):,}")
    lines += [f"  {n:>7,}  {name}" for name, n in s.faults.most_common()]
    lines.append("answered by: " + ", ".join(f"{m} {n:,}" for m, n in s.models.most_common()))

    samples = o.samples
    warm = _sample_at(samples, args.warmup)
    end = samples[-1]
    after = [p for p in samples if p.t >= warm.t]
    tail = [p for p in after if p.t >= warm.t + 2 * (end.t - warm.t) / 3]
    minutes = max((end.t - warm.t) / 60, 1e-9)
    lines += [
        f"proxy RSS   start {o.start_rss_mb:.1f} MB (ready, idle) | post-warm-up "
        f"{warm.proxy_mb:.1f} MB (t={warm.t:.0f} s) | end {end.proxy_mb:.1f} MB "
        f"(t={end.t:.0f} s) | peak {max(p.proxy_mb for p in samples):.1f} MB",
        f"RSS growth after warm-up: {(end.proxy_mb - warm.proxy_mb) / minutes:+.2f} MB/min "
        f"end-to-end, {slope_mb_per_min(after):+.2f} MB/min least squares, "
        f"{slope_mb_per_min(tail):+.2f} MB/min over the last third",
        *_idle_line(o.idle, warm),
        f"simulator RSS {samples[0].sim_mb:.1f} -> {end.sim_mb:.1f} MB",
        f"proxy CPU   {o.proxy_cpu_s:.0f} s = {o.proxy_cpu_s / o.elapsed_s:.2f} CPUs, "
        f"{1000 * o.proxy_cpu_s / max(s.requests, 1):.2f} ms per client request",
        f"RSS timeline (every {args.progress:g} s: t s, proxy RSS MB, of which memos by the "
        "proxy's estimate MB and glibc's main heap ([heap]) MB, simulator RSS MB, requests):",
    ]
    mark = 0.0
    for p in samples:
        if p.t >= mark or p is end:
            lines.append(
                f"  {p.t:6.0f} {p.proxy_mb:8.1f} {p.memo_mb:8.1f} {p.heap_mb:8.1f} {p.sim_mb:8.1f} "
                f"{p.requests:>10,}"
            )
            mark = (p.t // args.progress + 1) * args.progress
    lines.append("applied (x-agentproxy-applied, as the client saw it):")
    lines += [f"  {n:>7,}  {name}" for name, n in s.applied.most_common()]
    lines.append("proxy /metrics:")
    for name, rows in parse_metrics(o.metrics).items():
        lines.append(f"  {name}")
        if name.endswith("_bytes"):
            lines += [f"    {v / 2**20:>9,.1f} MB  {labels}" for labels, v in sorted(rows)]
        else:
            lines += [f"    {v:>12,.0f}  {labels}" for labels, v in sorted(rows) if v]
    lines += o.notes
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--agents", type=int, default=50, help=f"concurrent agents [50, max {MAX_AGENTS}]"
    )
    parser.add_argument(
        "--seconds", type=float, default=600, help=f"length of the run [600, max {MAX_SECONDS:g}]"
    )
    parser.add_argument("--store", choices=["local", "redis"], default="local")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--warmup",
        type=float,
        help="seconds before the post-warm-up RSS [10 %% of the run, max 60]",
    )
    parser.add_argument("--progress", type=float, default=30, help="seconds between progress lines")
    parser.add_argument("--fault-rate", type=float, default=0.5, help="faults per second [0.5]")
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma-separated fault kinds to inject [all: {','.join(FAULTS)}]",
    )
    parser.add_argument("--stream-share", type=float, default=0.5, help="streamed requests [0.5]")
    parser.add_argument("--think-ms", type=float, default=50, help="mean tool time per call [50]")
    parser.add_argument(
        "--chunk-delay", type=float, default=0.001, help="simulator's seconds between SSE chunks"
    )
    parser.add_argument("--memo-mb", type=int, help="the proxy's server.memo_mb [its default]")
    parser.add_argument(
        "--memo-idle-s", type=float, help="the proxy's server.memo_idle_s [its default]"
    )
    parser.add_argument(
        "--glibc-threshold",
        action="store_true",
        help="leave glibc's own rising mmap threshold (server.mmap_threshold_kb: null)",
    )
    parser.add_argument(
        "--max-rss-mb",
        type=int,
        help="the proxy's server.max_rss_mb: a parent replaces the worker past it [none]",
    )
    parser.add_argument(
        "--store-mb",
        type=int,
        help="the proxy's store.max_mb [its default, 1024, which ~150 req/s fill in 20 min]",
    )
    parser.add_argument(
        "--cooldown",
        type=float,
        default=60,
        help="seconds to keep sampling the idle proxy's RSS after the traffic stops [60]",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (logs, store)")
    parser.add_argument(
        "--heaptrack",
        action="store_true",
        help="run the proxy under heaptrack (every malloc and free; implies --keep)",
    )
    parser.add_argument(
        "--proxy-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the proxy alone, e.g. MALLOC_MMAP_THRESHOLD_=32768",
    )
    args = parser.parse_args(argv)
    args.keep = args.keep or args.heaptrack
    if bad := [item for item in args.proxy_env if "=" not in item.strip("=")]:
        parser.error(f"--proxy-env takes NAME=VALUE, not {bad[0]!r}")
    if args.heaptrack and shutil.which("heaptrack") is None:
        parser.error("--heaptrack needs heaptrack on PATH (Debian: apt-get install heaptrack)")
    if not 1 <= args.agents <= MAX_AGENTS:
        parser.error(f"--agents must be 1..{MAX_AGENTS}")
    if not 0 < args.seconds <= MAX_SECONDS:
        parser.error(f"--seconds must be in (0, {MAX_SECONDS:g}]")
    args.faults = [kind.strip() for kind in args.faults.split(",") if kind.strip()]
    if unknown := set(args.faults) - set(FAULTS):
        parser.error(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(FAULTS)}")
    if not args.faults:
        args.fault_rate = 0.0
    if args.warmup is None:
        args.warmup = min(60.0, args.seconds / 10)
    if not 0 <= args.warmup < args.seconds:
        parser.error("--warmup must be shorter than the run")
    if not 0 <= args.stream_share <= 1 or args.fault_rate < 0 or args.progress <= 0:
        parser.error("--stream-share in [0, 1], --fault-rate >= 0, --progress > 0")
    return args


async def drive(args: argparse.Namespace, proxy: Child, sim: Child, start_rss: float) -> Outcome:
    url = f"http://127.0.0.1:{proxy.port}{CHAT_PATH}"
    sim_url = f"http://127.0.0.1:{sim.port}"
    check_loopback(url)
    check_loopback(sim_url)
    connector = aiohttp.TCPConnector(limit=args.agents + 8)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        stats = Stats(started=time.perf_counter())
        run = Run(
            http,
            url,
            secrets.token_hex(3),
            args.stream_share,
            args.think_ms / 1000,
            args.seed,
            stats,
        )
        loop = asyncio.get_running_loop()
        # The first Ctrl-C ends the run early but still reports; a second one is not caught.
        loop.add_signal_handler(signal.SIGINT, _on_sigint, loop, run)
        cpu_before = tree_cpu_s(proxy.pid)
        samples: list[Sample] = []
        background = [
            asyncio.create_task(sampler(run, proxy, sim, samples, args.progress)),
            asyncio.create_task(chaos(run, sim_url, args.fault_rate, args.faults)),
        ]
        agents = [asyncio.create_task(agent(run, i)) for i in range(args.agents)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.stop.wait(), args.seconds)
        run.stop.set()
        elapsed = time.perf_counter() - stats.started
        proxy_cpu = tree_cpu_s(proxy.pid) - cpu_before if proxy.process.poll() is None else math.nan
        samples.append(
            Sample(elapsed, _rss_or_nan(proxy.pid), _rss_or_nan(sim.pid), stats.requests)
        )
        # In-flight requests are cut at the deadline (the proxy sees clients going away).
        for task in agents:
            task.cancel()
        await asyncio.gather(*agents, *background, return_exceptions=True)
        loop.remove_signal_handler(signal.SIGINT)
        metrics = await scrape(http, proxy.port)
        samples[-1].memo_mb = memo_mb(parse_metrics(metrics))
        samples[-1].heap_mb = heap_mb(proxy.pid)
        idle = await cool_down(http, proxy, sim, args.cooldown)
    return Outcome(args, stats, elapsed, samples, start_rss, proxy_cpu, metrics, idle)


async def cool_down(
    http: aiohttp.ClientSession, proxy: Child, sim: Child, seconds: float
) -> list[Sample]:
    """The idle proxy's RSS after the traffic stopped: does it come back down?"""
    idle: list[Sample] = []
    stopped = time.perf_counter()
    while (t := time.perf_counter() - stopped) < seconds and proxy.process.poll() is None:
        await asyncio.sleep(min(RSS_SAMPLE_S, seconds - t))
        sample = Sample(
            time.perf_counter() - stopped, _rss_or_nan(proxy.pid), _rss_or_nan(sim.pid), 0
        )
        sample.memo_mb = memo_mb(parse_metrics(await scrape(http, proxy.port)))
        idle.append(sample)
    if idle:
        print(
            f"[idle {idle[-1].t:4.0f} s] proxy RSS {idle[-1].proxy_mb:.1f} MB "
            f"(memos {idle[-1].memo_mb:.1f} MB)",
            flush=True,
        )
    return idle


def _on_sigint(loop: asyncio.AbstractEventLoop, run: Run) -> None:
    print("\ninterrupted: ending the run early (Ctrl-C again to abort)", flush=True)
    run.stop.set()
    loop.remove_signal_handler(signal.SIGINT)


def _raise_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def disk_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def benchmark(args: argparse.Namespace, procs: Processes, workdir: Path) -> Outcome:
    redis: Redis | None = None
    prefix = f"agentproxy-load-{secrets.token_hex(4)}:"
    notes: list[str] = []
    outcome: Outcome | None = None
    if args.store == "redis":
        redis = Redis(args.redis_url)
        if redis.command("PING") != "PONG":
            raise RuntimeError(f"no PONG from {args.redis_url}")
        notes.append(f"redis used_memory before: {redis.used_memory_mb():.1f} MB")
    try:
        sim = start_child(
            procs,
            [
                "simulate",
                "--context-window",
                str(SIM_WINDOW),
                "--chunk-delay",
                str(args.chunk_delay),
            ],
            free_port(),
            workdir / "simulator.log",
            "/v1/models",
        )
        state = workdir / "state"
        config = workdir / "load.yaml"
        config.write_text(
            config_text(
                sim.port,
                state,
                args.store,
                args.redis_url,
                prefix,
                args.memo_mb,
                args.store_mb,
                args.max_rss_mb,
                args.memo_idle_s,
                args.glibc_threshold,
            )
        )
        validate(config)
        wrap = heaptrack_command(workdir) if args.heaptrack else []
        proxy = start_child(
            procs,
            ["serve", "--config", str(config)],
            free_port(),
            workdir / "proxy.log",
            "/readyz",
            wrap,
            args.proxy_env,
        )
        start_rss = _rss_or_nan(proxy.pid)
        print(
            f"simulator on 127.0.0.1:{sim.port}, proxy on 127.0.0.1:{proxy.port} "
            f"(RSS {start_rss:.1f} MB), store {args.store}; {args.agents} agents for "
            f"{args.seconds:g} s, warm-up {args.warmup:g} s; logs in {workdir}",
            flush=True,
        )
        outcome = asyncio.run(drive(args, proxy, sim, start_rss))
        if proxy.process.poll() is not None:
            notes.append(
                f"!!! the proxy died (exit {proxy.process.returncode}):\n{_tail(proxy.log)}"
            )
        if args.heaptrack:
            notes.append(stop_traced(proxy))
        notes.append(f"on disk: {disk_mb(workdir):.1f} MB in {workdir} (store, event log, logs)")
        if redis is not None:
            keys = sum(1 for _ in redis.keys(prefix))
            notes.append(f"redis: {keys:,} keys under {prefix!r}")
            notes.append(f"redis used_memory after: {redis.used_memory_mb():.1f} MB")
        outcome.notes = notes
        return outcome
    finally:
        if redis is not None:
            procs.stop_all()  # the proxy first: it must not write while we delete
            try:
                said = f"redis: deleted {redis.delete_prefix(prefix):,} keys under {prefix!r}"
            except (OSError, RuntimeError) as exc:
                said = f"!!! redis: could not delete the keys under {prefix!r}: {exc}"
            redis.close()
            notes.append(said)  # the outcome's notes, when the run got that far
            if outcome is None:
                print(said, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    procs = Processes()
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    workdir = Path(tempfile.mkdtemp(prefix="agentproxy-load-"))
    try:
        outcome = benchmark(args, procs, workdir)
    except KeyboardInterrupt:
        print("interrupted; stopping the simulator and the proxy", file=sys.stderr)
        return 130
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"load run failed: {exc}", file=sys.stderr)
        return 1
    finally:
        procs.stop_all()
        signal.signal(signal.SIGTERM, previous)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report(outcome), flush=True)
    return 1 if outcome.stats.ok == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
