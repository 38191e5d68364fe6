"""How much latency, CPU and memory the proxy adds on top of a (static, instant) upstream.

One run starts a static upstream (bench/_static_upstream.py: OpenAI chat and Responses,
Anthropic Messages) and the proxy, each in its own process, then loads the upstream directly and
through the proxy with the same client, for concurrency 1 and 16, JSON and streaming: on the chat
route a tiny and a ~30 KB agent-turn body; on both the chat and the Responses route
(POST /v1/responses) a ~50 KB Codex turn, and on both the chat and the Anthropic route
(POST /v1/messages) a ~77 KB Claude Code turn, to compare each route with chat at the same size.
The 77 KB rows go through a second proxy whose configuration adds an `anthropic/` deployment
(which makes the proxy import litellm at start): the first one's start-up figures stay those of
a chat-only configuration, which also serves Responses (its `openai/` deployment speaks it).

    python bench/overhead.py            # 5 s per run, ~5 minutes in all
    python bench/overhead.py --quick    # 1 s per run smoke test, ~70 s
    python bench/overhead.py --json     # results as JSON on stdout (progress goes to stderr)

Traffic goes to 127.0.0.1 only. Every process started here is stopped on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import math
import os
import platform
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import _payloads
import orjson
from _load import LoadResult, Wire, python_load, wrk_load, wrk_path, wrk_version
from _static_upstream import FIRST_WORD, generate_events, response_events

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
CHAT_PATH = "/v1/chat/completions"
MESSAGES_PATH = "/v1/messages"
RESPONSES_PATH = "/v1/responses"
ANTHROPIC_ALIAS = _payloads.CLAUDE_MODEL
GEMINI_ALIAS = _payloads.GEMINI_MODEL
# Gemini's action is in its path: generateContent answers whole, streamGenerateContent streams.
GEMINI_PATH = f"/v1beta/models/{GEMINI_ALIAS}:generateContent"
GEMINI_STREAM_PATH = f"/v1beta/models/{GEMINI_ALIAS}:streamGenerateContent?alt=sse"
UPSTREAM_KEY = "bench-upstream-key"  # what the proxy sends the static upstream (ignored there)
MAX_REQUESTS_PER_RUN = 1_000_000
WARMUP_MAX_REQUESTS = 2_000
READY_TIMEOUT_S = 30.0
READY_POLL_S = 0.010
CHAT = "chat"
ANTHROPIC = "anth"
RESPONSES = "resp"
GEMINI = "gem"  # bench/cpu.py's cells only: not one of this benchmark's scenarios
SIZED = "77KB"  # the body size the Anthropic route is compared with chat at (second proxy)
CODEX_SIZED = "50KB"  # the body size the Responses route is compared with chat at
COMPARED = {RESPONSES: CODEX_SIZED, ANTHROPIC: SIZED}  # route -> the chat rows it is held to
TITLES = {RESPONSES: "50 KB: responses vs chat", ANTHROPIC: "77 KB: anth vs chat"}
BODIES: dict[tuple[str, str], Callable[[bool], bytes]] = {
    (CHAT, "tiny"): _payloads.tiny,
    (CHAT, "30KB"): _payloads.agent_turn,
    (CHAT, CODEX_SIZED): _payloads.codex_chat_turn,
    (RESPONSES, CODEX_SIZED): _payloads.codex_turn,
    (CHAT, SIZED): _payloads.claude_code_chat_turn,
    (ANTHROPIC, SIZED): _payloads.claude_code_turn,
}
WIRES = {
    CHAT: Wire(headers={}, stream_end=b"data: [DONE]\n\n", first_token=FIRST_WORD.encode()),
    ANTHROPIC: Wire(
        headers={"x-api-key": "bench-client-key", "anthropic-version": "2023-06-01"},
        stream_end=b'data: {"type":"message_stop"}\n\n',
        first_token=FIRST_WORD.encode(),
    ),
    RESPONSES: Wire(
        headers={"Authorization": "Bearer bench-client-key"},
        stream_end=response_events()[-1][-48:],  # the end of response.completed
        first_token=FIRST_WORD.encode(),  # in the first response.output_text.delta
    ),
    GEMINI: Wire(
        headers={"x-goog-api-key": "bench-client-key"},
        stream_end=generate_events()[-1][-48:],  # the end of the chunk with the finish reason
        first_token=FIRST_WORD.encode(),
    ),
}
PATHS = {CHAT: CHAT_PATH, ANTHROPIC: MESSAGES_PATH, RESPONSES: RESPONSES_PATH}


# --- targets ---------------------------------------------------------------------------------

# The absolute targets are for the chat route's tiny and 30 KB rows.
TARGET_ADDED_P50_MS = 0.5  # c=1, 30 KB
TARGET_RPS = 2000.0  # c=16
TARGET_CPU_MS = 0.5  # per proxied request
TARGET_TTFB_ADDED_MS = 0.5  # streaming, c=1
# Anthropic route ÷ chat route at 77 KB, Responses route ÷ chat route at 50 KB: added p50 (c=1)
# and proxy CPU ms per request.
TARGET_ROUTE_RATIO = 1.2
TARGET_RSS_MB = 60.0  # idle, right after ready
TARGET_READY_S = 1.0
# Against the bare aiohttp forwarder in the same run (issue 14), on the chat route's common
# turn (tiny and 30 KB): c=16 rps at least 80% of its, CPU ms per request at most 1.25x its,
# c=1 added p50 at most 1.1x its, streamed first token within 0.3 ms of its.
TARGET_RPS_VS_BARE = 0.8
TARGET_CPU_VS_BARE = 1.25
TARGET_ADDED_VS_BARE = 1.1
TARGET_TTFB_OVER_BARE_MS = 0.3
# Other processes using more CPU than this on average while we measure spoil the numbers.
BUSY_MACHINE_CPUS = 0.1


# --- processes -------------------------------------------------------------------------------


class Processes:
    """Every child process started here; `stop_all` ends them (TERM, then KILL)."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen[bytes]] = []

    def spawn(self, command: list[str], **options: Any) -> subprocess.Popen[bytes]:
        # Own session: a Ctrl-C reaches only us, and we stop the children in order.
        child = subprocess.Popen(command, start_new_session=True, **options)
        self.children.append(child)
        return child

    def stop_all(self) -> None:
        for child in reversed(self.children):
            if child.poll() is None:
                child.terminate()
        for child in reversed(self.children):
            try:
                child.wait(timeout=3)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=3)


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def start_upstream(procs: Processes) -> tuple[int, subprocess.Popen[bytes]]:
    command = [sys.executable, str(BENCH_DIR / "_static_upstream.py"), "--port", "0"]
    return _listening(procs, command, "the static upstream")


def start_bare_forwarder(
    procs: Processes, upstream_port: int, event_loop: str
) -> tuple[int, subprocess.Popen[bytes]]:
    upstream = f"http://127.0.0.1:{upstream_port}"
    command = [sys.executable, str(BENCH_DIR / "_bare_forwarder.py"), "--upstream", upstream]
    command += ["--uvloop"] if event_loop == "uvloop" else []
    return _listening(procs, command, "the bare forwarder")


def _listening(
    procs: Processes, command: list[str], what: str
) -> tuple[int, subprocess.Popen[bytes]]:
    """A child that prints `listening <port>` once bound: its port, and the child."""
    child = procs.spawn(command, stdout=subprocess.PIPE)
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], 10)
    line = child.stdout.readline().decode() if ready else ""
    if not line.startswith("listening "):
        raise RuntimeError(f"{what} did not start (said {line!r})")
    return int(line.split()[1]), child


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_config(
    directory: Path,
    upstream_port: int,
    *,
    anthropic: bool = False,
    gemini: bool = False,
    event_loop: str = "asyncio",
) -> Path:
    """The chat alias `bench`; with `anthropic`, also an `anthropic/` deployment (native
    /v1/messages passthrough to the static upstream); with `gemini`, a `gemini/` one (native
    generateContent to the static upstream's /v1beta). On the event loop named (never `auto`:
    the figures say which one they are of)."""
    deployments = [("bench", "openai/bench", f"http://127.0.0.1:{upstream_port}/v1", None)]
    if anthropic:
        deployments.append(
            (
                ANTHROPIC_ALIAS,
                f"anthropic/{ANTHROPIC_ALIAS}",
                f"http://127.0.0.1:{upstream_port}",
                UPSTREAM_KEY,
            )
        )
    if gemini:
        gemini_base = f"http://127.0.0.1:{upstream_port}"
        deployments.append((GEMINI_ALIAS, f"gemini/{GEMINI_ALIAS}", gemini_base, UPSTREAM_KEY))
    text = f"server: {{event_loop: {event_loop}}}\nmodel_list:\n"
    for alias, model, api_base, api_key in deployments:
        text += (
            f"  - model_name: {alias}\n    litellm_params:\n      model: {model}\n"
            f"      api_base: {api_base}\n"
        )
        if api_key:
            text += f"      api_key: {api_key}\n"
    name = "bench" + ("-anthropic" if anthropic else "") + ("-gemini" if gemini else "")
    path = directory / f"{name}.yaml"
    path.write_text(text)
    return path


@dataclass(slots=True)
class Proxy:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    ready_s: float

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def start_proxy(procs: Processes, config: Path, log_path: Path) -> Proxy:
    port = free_port()
    command = [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with log_path.open("wb") as log:
        started = time.perf_counter()
        child = procs.spawn(
            command, env=env, cwd=config.parent, stdout=log, stderr=subprocess.STDOUT
        )
    ready_s = wait_ready(child, port, started, log_path)
    return Proxy(child, port, log_path, ready_s)


def wait_ready(child: subprocess.Popen[bytes], port: int, started: float, log: Path) -> float:
    """Seconds from spawn to the first 200 from GET /readyz, polling every 10 ms."""
    while time.perf_counter() - started < READY_TIMEOUT_S:
        if child.poll() is not None:
            raise RuntimeError(f"the proxy exited with {child.returncode}:\n{log.read_text()}")
        if _readyz(port) == 200:
            return time.perf_counter() - started
        time.sleep(READY_POLL_S)
    raise RuntimeError(f"the proxy was not ready within {READY_TIMEOUT_S:g}s:\n{log.read_text()}")


def _readyz(port: int) -> int | None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status
    except OSError:
        return None
    finally:
        connection.close()


# --- /proc -----------------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_s(pid: int) -> float:
    """utime + stime of the whole process (all threads), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5), 1-based
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> tuple[float, float]:
    """(busy, stolen) CPU seconds of the whole machine since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = fields
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system) / tick, steal / tick


def own_cpu_s(pids: list[int]) -> float:
    """CPU seconds of this process, its reaped children (wrk) and the live `pids`."""
    times = os.times()
    mine = times.user + times.system + times.children_user + times.children_system
    return mine + sum(cpu_s(pid) for pid in pids)


@dataclass(slots=True)
class Quietness:
    """How busy the rest of the machine was while we measured."""

    others_cpus: float  # average CPUs used by processes other than ours
    steal_cpus: float  # average CPUs taken by the hypervisor


@contextlib.contextmanager
def watch_others(pids: list[int], into: list[Quietness]) -> Iterator[None]:
    started = time.perf_counter()
    busy, steal = machine_cpu_s()
    own = own_cpu_s(pids)
    yield
    wall = time.perf_counter() - started
    busy_after, steal_after = machine_cpu_s()
    others = (busy_after - busy) - (own_cpu_s(pids) - own)
    into.append(Quietness(max(0.0, others) / wall, (steal_after - steal) / wall))


def settle(pid: int, quiet_s: float = 0.2, limit_s: float = 5.0) -> None:
    """Waits until `pid` burns no CPU for `quiet_s` (its start-up work in the background done)."""
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        before = cpu_s(pid)
        time.sleep(quiet_s)
        if cpu_s(pid) == before:
            return


# --- runs ------------------------------------------------------------------------------------


@dataclass(slots=True)
class Settings:
    seconds: float
    warmup_s: float
    use_wrk: bool
    event_loop: str = "asyncio"  # of the proxy and the bare forwarder alike


@dataclass(slots=True)
class Scenario:
    concurrency: int
    route: str  # CHAT, RESPONSES or ANTHROPIC
    body_name: str
    stream: bool

    @property
    def mode(self) -> str:
        return "stream" if self.stream else "json"

    @property
    def name(self) -> str:
        return f"c={self.concurrency} {self.route} {self.body_name} {self.mode}"

    @property
    def row(self) -> str:
        """The name in aligned columns, for the table."""
        return f"{f'c={self.concurrency}':<4} {self.route:<4} {self.body_name:<5} {self.mode}"

    @property
    def body(self) -> bytes:
        return BODIES[self.route, self.body_name](self.stream)

    @property
    def wire(self) -> Wire:
        return WIRES[self.route]

    @property
    def path(self) -> str:
        return PATHS[self.route]

    @property
    def sized(self) -> bool:
        """One of the 77 KB rows comparing the routes (served by the second proxy)."""
        return self.body_name == SIZED

    @property
    def compared(self) -> bool:
        """One of the rows comparing a route with chat at the same size (50 or 77 KB)."""
        return self.body_name in COMPARED.values()


@dataclass(slots=True)
class Measured:
    """One side (direct or through the proxy) of one scenario."""

    load: LoadResult
    cpu_ms_per_req: float | None  # of the proxy (or bare forwarder); not for direct runs
    upstream_cpu_ms_per_req: float
    ttfb: LoadResult | None = None  # extra python run for first-byte times when wrk measured

    @property
    def errors(self) -> int:
        return self.load.errors + (self.ttfb.errors if self.ttfb else 0)


@dataclass(slots=True)
class Outcome:
    scenario: Scenario
    body_bytes: int
    direct: Measured
    proxy: Measured
    bare: Measured  # the same load through a bare aiohttp forwarder (_bare_forwarder.py)

    @property
    def added_p50_ms(self) -> float:
        return self.proxy.load.p50_ms - self.direct.load.p50_ms

    @property
    def p50_ratio(self) -> float:
        return _ratio(self.proxy.load.p50_ms, self.direct.load.p50_ms)

    @property
    def rps_ratio(self) -> float:
        return _ratio(self.proxy.load.rps, self.direct.load.rps)

    def ttfb_ms(self, which: str) -> float | None:
        measured = self.direct if which == "direct" else self.proxy
        source = measured.ttfb or measured.load
        return source.ttfb_p50_ms

    @property
    def added_ttfb_ms(self) -> float | None:
        direct, proxy = self.ttfb_ms("direct"), self.ttfb_ms("proxy")
        return None if direct is None or proxy is None else proxy - direct

    # --- against the bare forwarder: what the proxy adds over aiohttp's own cost ---

    @property
    def bare_added_p50_ms(self) -> float:
        return self.bare.load.p50_ms - self.direct.load.p50_ms

    @property
    def added_vs_bare(self) -> float:
        """The proxy's added p50 ÷ the bare forwarder's."""
        bare = self.bare_added_p50_ms
        return self.added_p50_ms / bare if bare > 0 else math.nan

    @property
    def rps_vs_bare(self) -> float:
        return _ratio(self.proxy.load.rps, self.bare.load.rps)

    @property
    def cpu_vs_bare(self) -> float:
        return _ratio(self.proxy.cpu_ms_per_req or 0.0, self.bare.cpu_ms_per_req or 0.0)

    @property
    def ttfb_over_bare_ms(self) -> float | None:
        bare, proxy = (self.bare.ttfb or self.bare.load).ttfb_p50_ms, self.ttfb_ms("proxy")
        return None if bare is None or proxy is None else proxy - bare


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


@dataclass(slots=True)
class RouteComparison:
    """Another route (Responses at 50 KB, Anthropic at 77 KB) against the chat route, same
    body size, concurrency and mode."""

    chat: Outcome
    other: Outcome

    @property
    def route(self) -> str:
        return self.other.scenario.route

    @property
    def label(self) -> str:
        s = self.chat.scenario
        return f"c={s.concurrency} {s.body_name} {s.mode}"

    @property
    def p50_ratio(self) -> float:
        """The other route's added p50 ÷ chat's (NaN when chat's added nothing measurable)."""
        chat = self.chat.added_p50_ms
        return self.other.added_p50_ms / chat if chat > 0 else math.nan

    @property
    def cpu_ratio(self) -> float:
        return _ratio(self.other.proxy.cpu_ms_per_req or 0.0, self.chat.proxy.cpu_ms_per_req or 0.0)


def route_comparisons(outcomes: list[Outcome], route: str) -> list[RouteComparison]:
    """`route`'s rows next to chat's at the same size, concurrency and mode."""
    by_key = {
        (o.scenario.route, o.scenario.body_name, o.scenario.concurrency, o.scenario.stream): o
        for o in outcomes
    }
    return [
        RouteComparison(chat, other)
        for (kind, body, concurrency, stream), chat in by_key.items()
        if kind == CHAT
        and body == COMPARED[route]
        and (other := by_key.get((route, body, concurrency, stream))) is not None
    ]


def scenarios() -> list[Scenario]:
    return [
        Scenario(concurrency, route, body, stream)
        for concurrency in (1, 16)
        for route, body in BODIES
        for stream in (False, True)
    ]


def measure(
    url: str, scenario: Scenario, settings: Settings, hop_pid: int | None, upstream_pid: int
) -> Measured:
    body = scenario.body
    # Warm-up with the python client: opens connections and checks the answers are right.
    warm = python_load(
        url,
        body,
        scenario.wire,
        concurrency=scenario.concurrency,
        stream=scenario.stream,
        seconds=settings.warmup_s,
        max_requests=WARMUP_MAX_REQUESTS,
    )
    if warm.errors:
        raise RuntimeError(f"warm-up of {url} failed: {warm.error_examples}")
    by_wrk = settings.use_wrk and scenario.concurrency > 1
    cpu_before = cpu_s(hop_pid) if hop_pid else 0.0
    upstream_before = cpu_s(upstream_pid)
    load = _load(url, body, scenario, settings, by_wrk)
    cpu = cpu_s(hop_pid) - cpu_before if hop_pid else None
    upstream_cpu = cpu_s(upstream_pid) - upstream_before
    done = max(load.requests, 1)
    ttfb = _load(url, body, scenario, settings, False) if by_wrk and scenario.stream else None
    return Measured(
        load=load,
        cpu_ms_per_req=None if cpu is None else cpu * 1000 / done,
        upstream_cpu_ms_per_req=upstream_cpu * 1000 / done,
        ttfb=ttfb,
    )


def _load(
    url: str, body: bytes, scenario: Scenario, settings: Settings, by_wrk: bool
) -> LoadResult:
    if by_wrk:
        return wrk_load(
            url, body, scenario.wire, concurrency=scenario.concurrency, seconds=settings.seconds
        )
    return python_load(
        url,
        body,
        scenario.wire,
        concurrency=scenario.concurrency,
        stream=scenario.stream,
        seconds=settings.seconds,
        max_requests=MAX_REQUESTS_PER_RUN,
    )


def run_scenarios(
    proxies: tuple[Proxy, Proxy],
    upstream: tuple[int, int],
    bare: tuple[int, int],
    settings: Settings,
) -> list[Outcome]:
    """`proxies`: the chat-only one, and the one with the `anthropic/` deployment (77 KB rows);
    `upstream` and `bare` (the forwarder): (port, pid) each."""
    (upstream_port, upstream_pid), (bare_port, bare_pid) = upstream, bare
    outcomes = []
    for scenario in scenarios():
        proxy = proxies[1] if scenario.sized else proxies[0]
        direct_url = f"http://127.0.0.1:{upstream_port}{scenario.path}"
        progress(f"{scenario.name} ({len(scenario.body):,} bytes): direct ...")
        direct = measure(direct_url, scenario, settings, None, upstream_pid)
        progress(f"{scenario.name}: bare forwarder ...")
        bare_url = f"http://127.0.0.1:{bare_port}{scenario.path}"
        forwarded = measure(bare_url, scenario, settings, bare_pid, upstream_pid)
        progress(f"{scenario.name}: proxy ...")
        try:
            url = proxy.url(scenario.path)
            proxied = measure(url, scenario, settings, proxy.process.pid, upstream_pid)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\nproxy log (last lines):\n{proxy.log_tail()}") from exc
        if proxy.process.poll() is not None:
            raise RuntimeError(f"the proxy died during {scenario.name}:\n{proxy.log_tail()}")
        outcomes.append(Outcome(scenario, len(scenario.body), direct, proxied, forwarded))
    return outcomes


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- report ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Startup:
    ready_s: float
    idle_rss_mb: float
    end_rss_mb: float


@dataclass(slots=True)
class Target:
    name: str
    value: float
    limit: float
    unit: str
    at_least: bool = False  # else at most

    @property
    def met(self) -> bool:
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    def describe(self) -> str:
        digits = {"rps": 0, "MB": 1, "s": 2, "x": 2}.get(self.unit, 3)
        bound = ">=" if self.at_least else "<="
        return f"{self.value:.{digits}f} {self.unit} (target {bound} {self.limit:g})"


@dataclass(slots=True)
class Report:
    startup: Startup  # the chat-only proxy
    anthropic_startup: Startup  # the proxy whose configuration adds the anthropic/ deployment
    outcomes: list[Outcome]
    environment: dict[str, Any]
    quietness: Quietness
    targets: list[Target] = field(default_factory=list)

    @property
    def disturbed(self) -> bool:
        # Steal is not counted: on small VMs it grows with our own load, even on a quiet host.
        return self.quietness.others_cpus > BUSY_MACHINE_CPUS

    def errors(self) -> list[str]:
        found = []
        for outcome in self.outcomes:
            for which, measured in (("direct", outcome.direct), ("proxy", outcome.proxy)):
                for load in (measured.load, measured.ttfb):
                    if load is not None and load.errors:
                        found.append(
                            f"{outcome.scenario.name} {which} ({load.tool}): {load.errors} "
                            f"failed of {load.requests + load.errors}: {load.error_examples}"
                        )
        return found


def evaluate(report: Report) -> list[Target]:
    outcomes = [o for o in report.outcomes if not o.scenario.compared]
    targets = [
        Target(f"added p50 {o.scenario.name}", o.added_p50_ms, TARGET_ADDED_P50_MS, "ms")
        for o in outcomes
        if o.scenario.concurrency == 1 and o.scenario.body_name == "30KB"
    ]
    targets += [
        Target(f"proxy rps {o.scenario.name}", o.proxy.load.rps, TARGET_RPS, "rps", True)
        for o in outcomes
        if o.scenario.concurrency == 16
    ]
    targets += [
        Target(f"CPU/req {o.scenario.name}", cpu, TARGET_CPU_MS, "ms")
        for o in outcomes
        if (cpu := o.proxy.cpu_ms_per_req) is not None
    ]
    targets += [
        Target(f"first token {o.scenario.name}", added, TARGET_TTFB_ADDED_MS, "ms")
        for o in outcomes
        if o.scenario.concurrency == 1 and (added := o.added_ttfb_ms) is not None
    ]
    for route in COMPARED:
        comparisons = route_comparisons(report.outcomes, route)
        targets += [
            Target(f"{route}/chat added p50 {c.label}", c.p50_ratio, TARGET_ROUTE_RATIO, "x")
            for c in comparisons
            if c.chat.scenario.concurrency == 1
        ]
        targets += [
            Target(f"{route}/chat CPU/req {c.label}", c.cpu_ratio, TARGET_ROUTE_RATIO, "x")
            for c in comparisons
        ]
    targets += bare_targets(outcomes)
    startup = report.startup
    targets.append(Target("idle RSS", startup.idle_rss_mb, TARGET_RSS_MB, "MB"))
    targets.append(Target("ready", startup.ready_s, TARGET_READY_S, "s"))
    return targets


def bare_targets(outcomes: list[Outcome]) -> list[Target]:
    """The proxy against the bare forwarder on the chat route's tiny and 30 KB rows."""
    common = [o for o in outcomes if o.scenario.body_name in ("tiny", "30KB")]
    targets = [
        Target(f"rps/bare {o.scenario.name}", o.rps_vs_bare, TARGET_RPS_VS_BARE, "x", True)
        for o in common
        if o.scenario.concurrency == 16
    ]
    targets += [
        Target(f"CPU/bare {o.scenario.name}", o.cpu_vs_bare, TARGET_CPU_VS_BARE, "x")
        for o in common
        if o.scenario.concurrency == 16
    ]
    targets += [
        Target(f"added/bare {o.scenario.name}", o.added_vs_bare, TARGET_ADDED_VS_BARE, "x")
        for o in common
        if o.scenario.concurrency == 1
    ]
    targets += [
        Target(f"first token-bare {o.scenario.name}", over, TARGET_TTFB_OVER_BARE_MS, "ms")
        for o in common
        if o.scenario.concurrency == 1 and (over := o.ttfb_over_bare_ms) is not None
    ]
    return targets


def format_bare(outcomes: list[Outcome]) -> list[str]:
    lines = [
        f"{'vs bare aiohttp forwarder':<25} {'bare added':>10} {'proxy added':>11} {'ratio':>7} "
        f"{'bare rps':>9} {'proxy rps':>9} {'ratio':>7} {'bare CPU':>9} {'proxy CPU':>9} "
        f"{'ratio':>7} {'1st token -bare':>15}"
    ]
    for o in outcomes:
        first_token = o.scenario.stream and o.scenario.concurrency == 1  # c=16: client-bound
        lines.append(
            f"{o.scenario.row:<25} {_ms(o.bare_added_p50_ms):>10} {_ms(o.added_p50_ms):>11} "
            f"{o.added_vs_bare:>6.2f}x {o.bare.load.rps:>9.0f} {o.proxy.load.rps:>9.0f} "
            f"{o.rps_vs_bare:>6.2f}x {_ms(o.bare.cpu_ms_per_req):>9} "
            f"{_ms(o.proxy.cpu_ms_per_req):>9} {o.cpu_vs_bare:>6.2f}x "
            f"{_ms(o.ttfb_over_bare_ms) if first_token else '':>15}"
        )
    lines.append(
        "(added = p50 - direct p50, ms; CPU = ms per request of the forwarding process; "
        "1st token -bare = the proxy's first-token p50 minus the forwarder's, ms)"
    )
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3f}"


def format_table(report: Report) -> str:
    header = (
        f"{'scenario':<25} {'tool':<6} {'direct p50':>10} {'proxy p50':>10} {'added p50':>10} "
        f"{'ratio':>7} {'direct p99':>10} {'proxy p99':>10} {'direct rps':>10} "
        f"{'proxy rps':>10} {'rps ratio':>9} {'proxy CPU ms/req':>16}"
    )
    lines = [header]
    for o in report.outcomes:
        d, p = o.direct.load, o.proxy.load
        flag = "  !!! ERRORS" if o.direct.errors or o.proxy.errors else ""
        lines.append(
            f"{o.scenario.row:<25} {p.tool:<6} {_ms(d.p50_ms):>10} {_ms(p.p50_ms):>10} "
            f"{_ms(o.added_p50_ms):>10} {o.p50_ratio:>6.2f}x {_ms(d.p99_ms):>10} "
            f"{_ms(p.p99_ms):>10} {d.rps:>10.0f} {p.rps:>10.0f} {o.rps_ratio:>8.2f}x "
            f"{_ms(o.proxy.cpu_ms_per_req):>16}{flag}"
        )
    lines.append(
        "(latencies in ms; stream latency is the full stream; chat = POST /v1/chat/completions, "
        "resp = POST /v1/responses, anth = POST /v1/messages; 77KB rows: the second proxy, with "
        "the anthropic/ deployment)"
    )
    lines.append("")
    lines.append(
        f"{'first token (stream)':<25} {'tool':<6} {'direct p50':>10} {'proxy p50':>10} "
        f"{'added p50':>10}"
    )
    for o in report.outcomes:
        if o.scenario.stream:
            lines.append(
                f"{o.scenario.row:<25} {'python':<6} {_ms(o.ttfb_ms('direct')):>10} "
                f"{_ms(o.ttfb_ms('proxy')):>10} {_ms(o.added_ttfb_ms):>10}"
            )
    lines.append("")
    lines.extend(format_bare(report.outcomes))
    for route in COMPARED:
        lines.append("")
        lines.extend(format_comparison(route, route_comparisons(report.outcomes, route)))
    s, a = report.startup, report.anthropic_startup
    lines.append("")
    lines.append(
        f"ready in {s.ready_s:.2f} s, idle RSS {s.idle_rss_mb:.1f} MB (end {s.end_rss_mb:.1f} MB)"
    )
    lines.append(
        f"with the anthropic/ deployment (litellm imported at start): ready in {a.ready_s:.2f} s, "
        f"idle RSS {a.idle_rss_mb:.1f} MB (end {a.end_rss_mb:.1f} MB)"
    )
    lines.append(
        f"targets: added p50 <= {TARGET_ADDED_P50_MS} ms (c=1, 30 KB), >= {TARGET_RPS:.0f} rps "
        f"(c=16), <= {TARGET_CPU_MS} CPU ms/req, first token within {TARGET_TTFB_ADDED_MS} ms of "
        f"direct (chat, tiny and 30 KB), RSS <= {TARGET_RSS_MB:.0f} MB, ready <= "
        f"{TARGET_READY_S:.0f} s (chat-only proxy); the Responses route's (50 KB) and the "
        f"Anthropic route's (77 KB) added p50 (c=1) and CPU ms/req within {TARGET_ROUTE_RATIO}x "
        "of the chat route's at the same size; against the bare forwarder (chat tiny and "
        f"30 KB): rps >= {TARGET_RPS_VS_BARE}x and CPU <= {TARGET_CPU_VS_BARE}x (c=16), added "
        f"p50 <= {TARGET_ADDED_VS_BARE}x and first token within {TARGET_TTFB_OVER_BARE_MS} ms "
        "(c=1)"
    )
    for target in report.targets:
        lines.append(
            f"  {'met   ' if target.met else 'MISSED'}  {target.name:<36} {target.describe()}"
        )
    errors = report.errors()
    if errors:
        lines.append(f"!!! {len(errors)} run(s) had failed requests; their numbers are not valid:")
        lines.extend(f"!!!   {line}" for line in errors)
    q = report.quietness
    if report.disturbed:
        lines.append(
            f"!!! the machine was busy: other processes used {q.others_cpus:.2f} CPUs on average "
            "while we measured; rerun on a quiet machine"
        )
    env = report.environment
    lines.append(
        f"({env['cpus']} CPUs, Python {env['python']}, {env['event_loop']} event loop, "
        f"load: {env['load_generator']}, "
        f"{env['seconds']:g} s per run; other processes used {q.others_cpus:.2f} CPUs, "
        f"hypervisor steal {q.steal_cpus:.2f} CPUs)"
    )
    return "\n".join(lines)


def format_comparison(route: str, comparisons: list[RouteComparison]) -> list[str]:
    lines = [
        f"{TITLES[route]:<24} {'chat added':>10} {f'{route} added':>10} {'ratio':>7} "
        f"{'chat CPU ms/req':>15} {f'{route} CPU ms/req':>15} {'ratio':>7}"
    ]
    for c in comparisons:
        lines.append(
            f"{c.label:<24} {_ms(c.chat.added_p50_ms):>10} {_ms(c.other.added_p50_ms):>10} "
            f"{c.p50_ratio:>6.2f}x {_ms(c.chat.proxy.cpu_ms_per_req):>15} "
            f"{_ms(c.other.proxy.cpu_ms_per_req):>15} {c.cpu_ratio:>6.2f}x"
        )
    lines.append(f"(added p50 in ms: proxy p50 - direct p50; ratio = {route} / chat)")
    return lines


def as_json(report: Report) -> bytes:
    outcomes = []
    for o in report.outcomes:
        outcomes.append(
            {
                "scenario": o.scenario.name,
                "route": o.scenario.path,
                "concurrency": o.scenario.concurrency,
                "body": o.scenario.body_name,
                "body_bytes": o.body_bytes,
                "stream": o.scenario.stream,
                "direct": _measured_json(o.direct),
                "proxy": _measured_json(o.proxy),
                "bare_forwarder": _measured_json(o.bare),
                "added_p50_ms": o.added_p50_ms,
                "bare_added_p50_ms": o.bare_added_p50_ms,
                "added_vs_bare": o.added_vs_bare,
                "rps_vs_bare": o.rps_vs_bare,
                "cpu_vs_bare": o.cpu_vs_bare,
                "ttfb_over_bare_ms": o.ttfb_over_bare_ms,
                "p50_ratio": o.p50_ratio,
                "rps_ratio": o.rps_ratio,
                "added_ttfb_p50_ms": o.added_ttfb_ms,
            }
        )
    document = {
        "environment": report.environment,
        "startup": asdict(report.startup),
        "anthropic_startup": asdict(report.anthropic_startup),
        "quietness": {**asdict(report.quietness), "disturbed": report.disturbed},
        "scenarios": outcomes,
        "anthropic_vs_chat": _comparisons_json(report, ANTHROPIC, "anthropic"),
        "responses_vs_chat": _comparisons_json(report, RESPONSES, "responses"),
        "targets": [{**asdict(t), "met": t.met} for t in report.targets],
        "errors": report.errors(),
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2)


def _comparisons_json(report: Report, route: str, name: str) -> list[dict[str, Any]]:
    return [
        {
            "scenario": c.label,
            "chat_added_p50_ms": c.chat.added_p50_ms,
            f"{name}_added_p50_ms": c.other.added_p50_ms,
            "added_p50_ratio": c.p50_ratio,
            "chat_cpu_ms_per_req": c.chat.proxy.cpu_ms_per_req,
            f"{name}_cpu_ms_per_req": c.other.proxy.cpu_ms_per_req,
            "cpu_ratio": c.cpu_ratio,
        }
        for c in route_comparisons(report.outcomes, route)
    ]


def _measured_json(measured: Measured) -> dict[str, Any]:
    return {
        **_load_json(measured.load),
        "proxy_cpu_ms_per_req": measured.cpu_ms_per_req,
        "upstream_cpu_ms_per_req": measured.upstream_cpu_ms_per_req,
        "ttfb_run": None if measured.ttfb is None else _load_json(measured.ttfb),
    }


def _load_json(result: LoadResult) -> dict[str, Any]:
    return {**asdict(result), "rps": result.rps}


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=5.0, help="timed seconds per run [5]")
    parser.add_argument("--quick", action="store_true", help="~1 s per run smoke test")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--no-wrk", action="store_true", help="use the python client even when wrk is installed"
    )
    parser.add_argument(
        "--uvloop",
        action="store_true",
        help="run the proxy and the bare forwarder on uvloop (the `speed` extra) [asyncio]",
    )
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    seconds = 1.0 if args.quick else args.seconds
    if seconds <= 0:
        raise SystemExit("--seconds must be positive")
    warmup = 0.2 if args.quick else min(1.0, seconds / 5)
    use_wrk = not args.no_wrk and wrk_path() is not None
    return Settings(seconds, warmup, use_wrk, "uvloop" if args.uvloop else "asyncio")


def environment(settings: Settings) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_generator": (
            f"{wrk_version()} for c=16, python aiohttp for c=1 and first token"
            if settings.use_wrk
            else "python aiohttp client"
        ),
        "seconds": settings.seconds,
        "warmup_s": settings.warmup_s,
        "event_loop": settings.event_loop,
    }


def benchmark(procs: Processes, workdir: Path, settings: Settings) -> Report:
    upstream_port, upstream = start_upstream(procs)
    progress(f"static upstream on 127.0.0.1:{upstream_port}")
    bare_port, bare = start_bare_forwarder(procs, upstream_port, settings.event_loop)
    settle(bare.pid)
    progress(f"bare aiohttp forwarder on 127.0.0.1:{bare_port}")
    loop = settings.event_loop
    config = write_config(workdir, upstream_port, event_loop=loop)
    proxy, idle_rss = _started(procs, config, workdir / "proxy.log")
    # Started once the first is ready and settled: its litellm import does not slow the first.
    config = write_config(workdir, upstream_port, anthropic=True, event_loop=loop)
    second, second_idle_rss = _started(procs, config, workdir / "proxy-anthropic.log")
    quietness: list[Quietness] = []
    pids = [proxy.process.pid, second.process.pid, upstream.pid, bare.pid]
    with watch_others(pids, quietness):
        outcomes = run_scenarios(
            (proxy, second), (upstream_port, upstream.pid), (bare_port, bare.pid), settings
        )
    startup = Startup(proxy.ready_s, idle_rss, rss_mb(proxy.process.pid))
    second_startup = Startup(second.ready_s, second_idle_rss, rss_mb(second.process.pid))
    report = Report(startup, second_startup, outcomes, environment(settings), quietness[0])
    report.targets = evaluate(report)
    return report


def _started(procs: Processes, config: Path, log: Path) -> tuple[Proxy, float]:
    """A ready and settled proxy, and its RSS right after ready."""
    proxy = start_proxy(procs, config, log)
    idle_rss = rss_mb(proxy.process.pid)
    settle(proxy.process.pid)
    progress(
        f"proxy ({config.name}) on 127.0.0.1:{proxy.port}, ready in {proxy.ready_s:.2f} s "
        f"(log {proxy.log_path})"
    )
    return proxy, idle_rss


@contextlib.contextmanager
def children() -> Iterator[Processes]:
    procs = Processes()
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        yield procs
    finally:
        procs.stop_all()
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    with tempfile.TemporaryDirectory(prefix="agentproxy-bench-") as tmp, children() as procs:
        try:
            report = benchmark(procs, Path(tmp), settings)
        except KeyboardInterrupt:
            progress("interrupted; stopping the upstream and the proxy")
            return 130
        except RuntimeError as exc:
            progress(f"benchmark failed: {exc}")
            return 1
    if args.json:
        sys.stdout.buffer.write(as_json(report) + b"\n")
    else:
        print(format_table(report))
    errors = report.errors()
    for line in errors:
        progress(f"!!! ERRORS: {line}")
    if report.disturbed:
        progress("!!! other processes were busy during the runs: the numbers are perturbed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
