"""CPU per request of the proxy and of the bare aiohttp forwarder, served in this process.

Both applications (the proxy as `build_app` makes it, with the default settings and the one
`bench` alias of bench/overhead.py; bench/_bare_forwarder.py's forwarder) run in this process on
real loopback sockets, in front of bench/_static_upstream.py (a process of its own). The load
comes from bench/_cpu_client.py, also a process of its own, so the CPU this process burns while
it runs (time.process_time: every thread) is what serving those requests cost. Each rep measures
every cell on both applications back to back after a warm-up; the figures are the medians over
the reps, and the proxy ÷ forwarder ratio. Wall-clock time plays no part: on a busy machine the
figures hold (within a few per cent), unlike throughput.

    python bench/cpu.py                                  # every cell, 3 reps of 2,000 requests
    python bench/cpu.py --cells chat-30KB-json --reps 5
    python bench/cpu.py --cells chat-30KB-json --profile out.prof   # cProfile the proxy's runs
    python bench/cpu.py --anthropic --cells anth-77KB-json          # the Anthropic route
    python bench/cpu.py --cells gem-30KB-json,gem-30KB-stream       # the Gemini route
    python bench/cpu.py --cells chat-tiny-json --without rewrites    # what the rewrites cost
    python bench/cpu.py --cells chat-tiny-json --without all         # the request's shell alone
    python bench/cpu.py --cells chat-30KB-json --record   # and a proxy recording every turn
    python bench/cpu.py --cells chat-30KB-json --limits   # 10 keys with rate limits vs without
    python bench/cpu.py --cells chat-30KB-json --guard    # and a proxy scrubbing secrets
    python bench/cpu.py --cells chat-tiny-json --board-redis redis://127.0.0.1:6379/0
                                 # every session listed in Redis (the shared board) vs not

With `--limits` the load goes through 10 API keys in turn, to two proxies side by side: `keys`
(the 10 keys) and `limited` (the same keys, each with its own rpm, tpm and max_concurrent, none
of them refusing: every request pays the whole check, its bucket taken and its slot held and
given back); the figure is the ratio limited / keys. `--limit-scopes` adds a policy limiting
each session, key, team and everyone too (five windows a request); `--limits-redis URL` puts
both proxies' store (and so the limited one's windows) in that Redis, under a prefix of the
run's own.

With `--anthropic` the proxy's configuration adds overhead.py's `anthropic/` deployment (which
imports litellm). A `gem-` cell posts the agent turn as Gemini's `generateContent` body (what
Gemini CLI sends, ~30 KB: function calls with their thought signatures, function responses,
function declarations) to `/v1beta/models/gemini-bench:generateContent`, or
`:streamGenerateContent?alt=sse` streamed, and adds a `gemini/` deployment that takes it
natively to the static upstream; the forwarder posts it to the same path. Traffic stays on
127.0.0.1; the upstream and clients are stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import logging
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
from _bare_forwarder import app as bare_app
from _payloads import gemini_turn
from _without import PARTS, turn_off
from aiohttp import web
from overhead import (
    BODIES,
    CHAT_PATH,
    GEMINI,
    GEMINI_PATH,
    GEMINI_STREAM_PATH,
    MESSAGES_PATH,
    REPO_ROOT,
    RESPONSES_PATH,
    Processes,
    free_port,
    start_upstream,
    write_config,
)

BENCH_DIR = Path(__file__).resolve().parent
LIMIT_KEYS = tuple(f"bench-key-{n}" for n in range(10))
# High enough that no bench run is refused (a refusal would be an error of the run), so every
# request pays the whole check: five buckets taken, five slots held and given back.
KEY_LIMITS = "{rpm: 100000000, tpm: 100000000000, max_concurrent: 64}"
SCOPES_POLICY = "policies:\n  - name: limited\n    limits:\n" + "".join(
    f"      {scope}: {KEY_LIMITS}\n" for scope in ("session", "key", "team", "global")
)
RECORDING_POLICY = (
    "policies:\n  - name: recorded\n    record: {enabled: true, max_mb_per_session: 1000000}\n"
)
GUARD_POLICY = "policies:\n  - name: guarded\n    guard: {secrets: {scrub: true}}\n"
PATHS = {"chat": CHAT_PATH, "anth": MESSAGES_PATH, "resp": RESPONSES_PATH, GEMINI: GEMINI_PATH}
CELL_BODIES = {**BODIES, (GEMINI, "30KB"): gemini_turn}  # overhead.py's, and Gemini's turn
CELLS_HELP = (
    "comma-separated ROUTE-SIZE-json|stream, of "
    + ", ".join(f"{route}-{size}" for route, size in CELL_BODIES)
    + " (chat: /v1/chat/completions, resp: /v1/responses, anth: /v1/messages with --anthropic,"
    " gem: Gemini's generateContent to a gemini/ deployment)"
)
DEFAULT_CELLS = (
    "chat-tiny-json,chat-tiny-stream,chat-30KB-json,chat-30KB-stream,"
    "resp-50KB-json,resp-50KB-stream"
)


@dataclass(frozen=True, slots=True)
class Cell:
    route: str
    size: str
    stream: bool

    @classmethod
    def parse(cls, name: str) -> Cell:
        route, size, mode = name.split("-")
        if (route, size) not in CELL_BODIES or mode not in ("json", "stream"):
            raise SystemExit(f"unknown cell {name!r}: {CELLS_HELP}")
        return cls(route, size, mode == "stream")

    @property
    def name(self) -> str:
        return f"{self.route}-{self.size}-{'stream' if self.stream else 'json'}"

    @property
    def body(self) -> bytes:
        return CELL_BODIES[(self.route, self.size)](self.stream)

    @property
    def path(self) -> str:
        """Gemini's says whether it streams; the others' bodies do."""
        return GEMINI_STREAM_PATH if self.route == GEMINI and self.stream else PATHS[self.route]


async def serve(app: web.Application, *, proxy: bool = False) -> tuple[web.AppRunner, int]:
    """The proxy as `serve` runs it (its head deadline too); the bare forwarder with the same
    server options."""
    from proxy.app import SERVER_OPTIONS
    from proxy.runtime.head_deadline import ProxyRunner

    runner = (
        ProxyRunner(app, handle_signals=False)
        if proxy
        else web.AppRunner(app, handle_signals=False, **SERVER_OPTIONS)
    )
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


class Client:
    """The client process of one cell: it loads a URL with a number of requests when asked."""

    def __init__(self, child: asyncio.subprocess.Process, cell: Cell) -> None:
        self.child = child
        self.cell = cell

    @classmethod
    async def start(
        cls, cell: Cell, body_file: Path, concurrency: int, keys: tuple[str, ...] = ()
    ) -> Client:
        command = [sys.executable, str(BENCH_DIR / "_cpu_client.py"), str(body_file)]
        command += [cell.route, str(concurrency)] + (["--stream"] if cell.stream else [])
        command += ["--keys", ",".join(keys)] if keys else []
        child = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        return cls(child, cell)

    async def load(self, url: str, requests: int) -> int:
        """The requests completed (the client checks every answer)."""
        assert self.child.stdin is not None and self.child.stdout is not None
        self.child.stdin.write(f"{url} {requests}\n".encode())
        await self.child.stdin.drain()
        line = await self.child.stdout.readline()
        if not line:
            raise RuntimeError(f"the client of {self.cell.name} exited")
        result = orjson.loads(line)
        if result["errors"]:
            raise RuntimeError(f"{self.cell.name} at {url}: {result['error_examples']}")
        done: int = result["requests"]
        return done

    async def stop(self) -> None:
        assert self.child.stdin is not None
        self.child.stdin.close()
        await self.child.wait()


class GcTimer:
    """CPU seconds spent in garbage collections (every generation), via gc.callbacks: with
    `--gc` only, as timing every collection costs ~5% of a request itself."""

    def __init__(self, on: bool) -> None:
        self.spent = 0.0
        self.collections = 0
        self._started = 0.0
        if on:
            gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.spent += time.process_time() - self._started
            self.collections += 1


@contextlib.contextmanager
def profiled(profile: cProfile.Profile | None) -> Iterator[None]:
    if profile is not None:
        profile.enable()
    try:
        yield
    finally:
        if profile is not None:
            profile.disable()


async def measure(
    ports: dict[str, int],
    cells: list[Cell],
    args: argparse.Namespace,
    workdir: Path,
    profile: cProfile.Profile | None,
) -> dict[tuple[str, str], list[float]]:
    """CPU µs per request for every (target, cell), one figure per rep. A rep alternates the
    targets in blocks (`--blocks`), so a machine that speeds up or slows down meanwhile
    weighs on both alike."""
    figures: dict[tuple[str, str], list[float]] = {}
    collecting = GcTimer(args.gc)
    for cell in cells:
        body_file = workdir / f"{cell.name}.json"
        body_file.write_bytes(cell.body)
        keys = LIMIT_KEYS if args.limits else ()
        client = await Client.start(cell, body_file, args.concurrency, keys)
        urls = {t: f"http://127.0.0.1:{port}{cell.path}" for t, port in ports.items()}
        for url in urls.values():
            await client.load(url, args.warmup)
        for rep in range(args.reps):
            used = dict.fromkeys(ports, 0.0)
            in_gc = dict.fromkeys(ports, 0.0)
            done = dict.fromkeys(ports, 0)
            for _ in range(args.blocks):
                for target, url in urls.items():
                    before, gc_before = time.process_time(), collecting.spent
                    with profiled(profile if target == args.profile_target else None):
                        done[target] += await client.load(url, args.requests // args.blocks)
                    used[target] += time.process_time() - before
                    in_gc[target] += collecting.spent - gc_before
            for target in ports:
                per = 1e6 / done[target]
                figures.setdefault((target, cell.name), []).append(used[target] * per)
                figures.setdefault((target + " gc", cell.name), []).append(in_gc[target] * per)
            got = {t: round(figures[(t, cell.name)][-1]) for t in ports}
            print(f"rep {rep + 1} {cell.name}: {got}", file=sys.stderr, flush=True)
        await client.stop()
    return figures


async def run(args: argparse.Namespace, workdir: Path) -> dict[tuple[str, str], list[float]]:
    from proxy.app import build_app
    from proxy.runtime import server

    cells = [Cell.parse(name) for name in args.cells.split(",")]
    procs = Processes()
    try:
        upstream_port, _ = start_upstream(procs)
        gemini = any(cell.route == GEMINI for cell in cells)
        config = write_config(workdir, upstream_port, anthropic=args.anthropic, gemini=gemini)
        os.chdir(workdir)  # the proxy's default store and event log live in its working dir
        runners = []
        ports: dict[str, int] = {}
        if args.target in ("both", "bare"):
            runner, ports["bare"] = await serve(bare_app(f"http://127.0.0.1:{upstream_port}"))
            runners.append(runner)
        if args.limits:  # the same 10 keys, without and with rate limits, side by side
            for target, limits in (("keys", ""), ("limited", f", limits: {KEY_LIMITS}")):
                keyed = workdir / f"{target}.yaml"
                entries = "".join(
                    f"    - {{name: k{n}, key: {key}, team: t{n % 3}{limits}}}\n"
                    for n, key in enumerate(LIMIT_KEYS)
                )
                policy = SCOPES_POLICY if limits and args.limit_scopes else ""
                store = ""
                if args.limits_redis:
                    prefix = f"{redis_prefix()}{target}:"
                    url = args.limits_redis
                    store = f"store: {{backend: redis, url: '{url}', prefix: '{prefix}'}}\n"
                text = config.read_text() + store + "keys:\n  api_keys:\n" + entries + policy
                keyed.write_text(text)
                runner, ports[target] = await serve(build_app(keyed, watch=False), proxy=True)
                runners.append(runner)
        elif args.target in ("both", "proxy") and args.board_redis:
            runners += await serve_board_pair(config, workdir, args.board_redis, ports)
        elif args.target in ("both", "proxy"):
            runner, ports["proxy"] = await serve(build_app(config, watch=False), proxy=True)
            runners.append(runner)
        if args.record:  # a second proxy recording every turn, its store a directory apart
            recording = workdir / "recording"
            recording.mkdir()
            recorded = recording / config.name
            recorded.write_text(
                config.read_text() + f"store: {{path: {recording}}}\n" + RECORDING_POLICY
            )
            runner, ports["recorded"] = await serve(build_app(recorded, watch=False), proxy=True)
            runners.append(runner)
        if args.guard:  # a second proxy scrubbing secrets (guard.secrets) from every turn
            guarding = workdir / "guarding"
            guarding.mkdir()
            guarded = guarding / config.name
            guarded.write_text(config.read_text() + f"store: {{path: {guarding}}}\n" + GUARD_POLICY)
            runner, ports["guarded"] = await serve(build_app(guarded, watch=False), proxy=True)
            runners.append(runner)
        profile = cProfile.Profile() if args.profile else None
        if hasattr(server, "freeze_heap"):  # as serve() does once listening (not before)
            server.freeze_heap()
        if args.gc_off:
            gc.disable()
        try:
            figures = await measure(ports, cells, args, workdir, profile)
        finally:
            for runner in runners:
                await runner.cleanup()
            for url in (args.limits_redis, args.board_redis):
                if url:
                    forget_redis_keys(url)
        if profile is not None:
            profile.dump_stats(args.profile)
            stats = pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime")
            stats.print_stats(args.top)
    finally:
        procs.stop_all()
    return figures


async def serve_board_pair(
    config: Path, workdir: Path, url: str, ports: dict[str, int]
) -> list[web.AppRunner]:
    """`proxy` and `shared`, both with their store in Redis (prefixes of their own): `proxy`'s
    shared board turned off (its unrecorded sessions on its own board only, as before it
    existed), `shared`'s on (every call's figures batched to the store's index)."""
    from proxy.app import build_app
    from proxy.state import SHARED_BOARD

    runners = []
    for target in ("proxy", "shared"):
        path = workdir / f"{target}.yaml"
        store = f"store: {{backend: redis, url: '{url}', prefix: '{redis_prefix()}{target}:'}}\n"
        path.write_text(config.read_text() + store)  # noqa: ASYNC240 (before serving)
        app = build_app(path, watch=False)
        runner, ports[target] = await serve(app, proxy=True)
        runners.append(runner)
        if target == "proxy":  # the calls still reach it, and go no further
            setattr(app[SHARED_BOARD], "saw", lambda *_: None)  # noqa: B010
    return runners


def redis_prefix() -> str:
    return f"agentproxy-bench-{os.getpid()}-"


def forget_redis_keys(url: str) -> None:
    """What the run left in Redis (its windows, its store's probe): deleted."""
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=redis_prefix() + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def report(figures: dict[tuple[str, str], list[float]], concurrency: int) -> None:
    cells = list(dict.fromkeys(cell for _, cell in figures))
    if any(target == "limited" for target, _ in figures):
        print("10 keys at their rate limits (--limits): CPU µs per request, median of reps")
        print(f"{'cell':<20} {'bare':>8} {'keys':>8} {'limited':>8} {'ratio':>7}   ratio each rep")
        for cell in cells:
            b, k, lim = (_median(figures.get((t, cell))) for t in ("bare", "keys", "limited"))
            limited, keyed = figures.get(("limited", cell)) or [], figures.get(("keys", cell)) or []
            pairs = zip(limited, keyed, strict=True)
            each = " ".join(f"{a / c:.3f}" for a, c in pairs)
            print(f"{cell:<20} {b:8.1f} {k:8.1f} {lim:8.1f} {lim / k:6.3f}x   {each}")
        return
    print("(gc b/p: µs per request inside garbage collections, bare / proxy; with --gc)")
    print(f"CPU µs per request, median of reps (c={concurrency})")
    head = f"{'cell':<20} {'bare':>8} {'proxy':>8} {'ratio':>7}  {'gc b/p':>9}"
    print(head + "   proxy reps (ratio each)")
    for cell in cells:
        b, p, bg, pg = (
            _median(figures.get((target, cell)))
            for target in ("bare", "proxy", "bare gc", "proxy gc")
        )
        proxies = figures.get(("proxy", cell)) or []
        ratios = [p / b for p, b in zip(proxies, figures.get(("bare", cell)) or [], strict=False)]
        reps = " ".join(f"{v:.0f}" for v in proxies)
        each = " ".join(f"{r:.2f}" for r in ratios)
        print(f"{cell:<20} {b:8.1f} {p:8.1f} {p / b:6.2f}x  {bg:4.0f}/{pg:<4.0f}   {reps} ({each})")
    for variant, what in (
        ("recorded", "recording every turn (--record)"),
        ("guarded", "scrubbing secrets (--guard)"),
        ("shared", "every session listed in Redis (--board-redis): proxy without, shared with"),
    ):
        if not any(target == variant for target, _ in figures):
            continue
        print(f"{what}: CPU µs per request, median of reps")
        print(f"{'cell':<20} {'proxy':>8} {variant:>9} {'ratio':>7}   ratio each rep")
        for cell in cells:
            p, r = (_median(figures.get((target, cell))) for target in ("proxy", variant))
            varied, plain = (
                figures.get((variant, cell)) or [],
                figures.get(("proxy", cell)) or [],
            )
            pairs = zip(varied, plain, strict=False)
            each = " ".join(f"{a / b:.2f}" for a, b in pairs)
            gc_p, gc_r = (_median(figures.get((t, cell))) for t in ("proxy gc", f"{variant} gc"))
            print(
                f"{cell:<20} {p:8.1f} {r:9.1f} {r / p:6.2f}x   {each}   (gc {gc_p:.0f}/{gc_r:.0f})"
            )


def _median(values: list[float] | None) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default=DEFAULT_CELLS, help=f"{CELLS_HELP} [{DEFAULT_CELLS}]")
    parser.add_argument("--target", choices=("both", "proxy", "bare"), default="both")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=4, help="alternations per rep")
    parser.add_argument("--anthropic", action="store_true", help="add the anthropic/ deployment")
    parser.add_argument("--gc", action="store_true", help="time the garbage collections")
    parser.add_argument("--gc-off", action="store_true", help="no garbage collection at all")
    parser.add_argument("--profile", help="cProfile the proxy's measured runs into this file")
    parser.add_argument("--top", type=int, default=45, help="profile lines printed")
    parser.add_argument(
        "--profile-target", default="proxy", help="which one --profile profiles [proxy]"
    )
    parser.add_argument(
        "--record", action="store_true", help="also a proxy recording every turn, compared"
    )
    parser.add_argument(
        "--limits", action="store_true", help="10 keys with rate limits vs the same without"
    )
    parser.add_argument(
        "--limit-scopes", action="store_true", help="with --limits: policy scopes too"
    )
    parser.add_argument("--limits-redis", metavar="URL", help="with --limits: both on Redis")
    parser.add_argument(
        "--guard", action="store_true", help="also a proxy scrubbing secrets, compared"
    )
    parser.add_argument(
        "--board-redis",
        metavar="URL",
        help="the proxy on Redis without the shared board vs with it (`shared`)",
    )
    parser.add_argument(
        "--without",
        metavar="PARTS",
        help=f"turn these parts of the proxy off (comma-separated, or all): {', '.join(PARTS)}",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    if args.without:
        print(f"proxy without: {', '.join(turn_off(args.without))}", file=sys.stderr)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        filename=os.devnull,
    )
    with tempfile.TemporaryDirectory(prefix="agentproxy-cpu-") as tmp:
        figures = asyncio.run(run(args, Path(tmp)))
    report(figures, args.concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
