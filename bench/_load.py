"""Load generators for the overhead benchmark: wrk (throughput) and an aiohttp client (latency).

Both POST one fixed body over keep-alive connections at a fixed concurrency for a bounded time
and request count, and return a `LoadResult`. Only loopback URLs are accepted. A `Wire` says
which headers go with the body and what a good answer looks like (chat or Anthropic).
"""

from __future__ import annotations

import asyncio
import math
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import orjson

MAX_ERROR_EXAMPLES = 3
REQUEST_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Wire:
    """A client's protocol, as far as a load run needs it."""

    headers: Mapping[str, str]  # sent with every request, besides Content-Type
    stream_end: bytes  # a complete stream ends with these bytes
    first_token: bytes  # the first text piece of a stream: its arrival is the time to first token


@dataclass(slots=True)
class LoadResult:
    tool: str  # "wrk" or "python"
    requests: int  # completed with a good answer inside the timed window
    errors: int  # non-200, malformed or failed, inside the timed window
    elapsed_s: float
    p50_ms: float
    p99_ms: float
    ttfb_p50_ms: float | None = None  # to the first token; streaming, python client only
    ttfb_p99_ms: float | None = None
    error_examples: list[str] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s > 0 else 0.0


def check_loopback(url: str) -> None:
    host = urlsplit(url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"refusing to send benchmark traffic to {host!r}: loopback only")


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted list (NaN when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


# --- Python client -----------------------------------------------------------------------


@dataclass(slots=True)
class _Tally:
    deadline: float
    budget: int  # requests still allowed to start
    latencies: list[float] = field(default_factory=list)
    ttfbs: list[float] = field(default_factory=list)
    errors: int = 0
    examples: list[str] = field(default_factory=list)

    def fail(self, reason: str) -> None:
        self.errors += 1
        if len(self.examples) < MAX_ERROR_EXAMPLES:
            self.examples.append(reason)


def python_load(
    url: str,
    body: bytes,
    wire: Wire,
    *,
    concurrency: int,
    stream: bool,
    seconds: float,
    max_requests: int,
    keys: tuple[str, ...] = (),
) -> LoadResult:
    """Runs the aiohttp client in this process; the caller is not the proxy's process. With
    `keys`, worker i sends keys[i % len(keys)] (as a bearer token and x-api-key)."""
    check_loopback(url)
    return asyncio.run(
        _python_load(url, body, wire, concurrency, stream, seconds, max_requests, keys)
    )


async def _python_load(
    url: str,
    body: bytes,
    wire: Wire,
    concurrency: int,
    stream: bool,
    seconds: float,
    max_requests: int,
    keys: tuple[str, ...] = (),
) -> LoadResult:
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    headers = {"Content-Type": "application/json", **wire.headers}
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=headers
    ) as session:
        started = time.perf_counter()
        tally = _Tally(deadline=started + seconds, budget=max_requests)
        await asyncio.gather(
            *(
                _worker(session, url, body, wire, stream, tally, _key_headers(keys, i))
                for i in range(concurrency)
            )
        )
        elapsed = time.perf_counter() - started
    latencies = sorted(tally.latencies)
    ttfbs = sorted(tally.ttfbs)
    return LoadResult(
        tool="python",
        requests=len(latencies),
        errors=tally.errors,
        elapsed_s=elapsed,
        p50_ms=percentile(latencies, 50) * 1000,
        p99_ms=percentile(latencies, 99) * 1000,
        ttfb_p50_ms=percentile(ttfbs, 50) * 1000 if stream else None,
        ttfb_p99_ms=percentile(ttfbs, 99) * 1000 if stream else None,
        error_examples=tally.examples,
    )


async def _worker(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    wire: Wire,
    stream: bool,
    tally: _Tally,
    headers: dict[str, str] | None = None,
) -> None:
    while tally.budget > 0 and time.perf_counter() < tally.deadline:
        tally.budget -= 1
        sent = time.perf_counter()
        try:
            async with session.post(url, data=body, headers=headers) as response:
                first, tail = await _drain(response, wire.first_token if stream else b"")
                done = time.perf_counter()
                problem = _problem(response.status, tail, wire, stream, first)
        except (TimeoutError, aiohttp.ClientError) as exc:
            tally.fail(f"{type(exc).__name__}: {exc}")
            continue
        if problem:
            tally.fail(problem)
            continue
        tally.latencies.append(done - sent)
        if stream:
            tally.ttfbs.append(first - sent)


def _key_headers(keys: tuple[str, ...], worker: int) -> dict[str, str] | None:
    if not keys:
        return None
    key = keys[worker % len(keys)]
    return {"Authorization": f"Bearer {key}", "x-api-key": key}


async def _drain(response: aiohttp.ClientResponse, marker: bytes) -> tuple[float, bytes]:
    """Reads the whole body; returns when `marker` arrived (when its first bytes did, for an
    empty marker; 0.0 if it never did) and the body's last 64 bytes."""
    first = 0.0
    tail = b""
    keep = max(64, len(marker))
    async for chunk in response.content.iter_any():
        seen = tail + chunk
        if not first and marker in seen:
            first = time.perf_counter()
        tail = seen[-keep:]
    return first, tail[-64:]


def _problem(status: int, tail: bytes, wire: Wire, stream: bool, first: float) -> str | None:
    if status != 200:
        return f"HTTP {status}: {tail!r}"
    if stream and not tail.endswith(wire.stream_end):
        return f"stream did not end with {wire.stream_end!r}: ...{tail!r}"
    if stream and not first:
        return f"stream had no {wire.first_token!r}"
    if not stream and not tail.rstrip().endswith(b"}"):
        return f"JSON body cut short: ...{tail!r}"
    return None


# --- wrk -----------------------------------------------------------------------------------

_WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
{headers}local f = assert(io.open("{body_path}", "rb"))
wrk.body = f:read("*a")
f:close()

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {{"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def wrk_path() -> str | None:
    return shutil.which("wrk")


def wrk_version() -> str:
    path = wrk_path()
    if path is None:
        return "absent"
    # `wrk -v` prints its version and usage, and exits 1.
    done = subprocess.run([path, "-v"], capture_output=True, text=True, timeout=5, check=False)
    found = re.search(r"\d+\.\d+(\.\d+)?", done.stdout + done.stderr)
    return f"wrk {found.group() if found else '(unknown version)'}"


def wrk_load(url: str, body: bytes, wire: Wire, *, concurrency: int, seconds: float) -> LoadResult:
    """Full-response latency and throughput; wrk counts HTTP >= 400 as errors (status)."""
    check_loopback(url)
    path = wrk_path()
    assert path is not None
    duration = max(1, round(seconds))  # wrk takes whole seconds
    with tempfile.TemporaryDirectory(prefix="agentproxy-wrk-") as tmp:
        body_path = Path(tmp) / "body.json"
        body_path.write_bytes(body)
        script = Path(tmp) / "post.lua"
        script.write_text(_wrk_script(body_path, wire.headers))
        command = [
            path,
            "-t1",
            f"-c{concurrency}",
            f"-d{duration}s",
            f"--timeout={REQUEST_TIMEOUT_S:g}s",
            "-s",
            str(script),
            url,
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=duration + 30, check=False
        )
    return _parse_wrk(done)


def _wrk_script(body_path: Path, headers: Mapping[str, str]) -> str:
    lines = "".join(f"wrk.headers[{_lua(k)}] = {_lua(v)}\n" for k, v in headers.items())
    return _WRK_SCRIPT.format(body_path=body_path, headers=lines)


def _lua(text: str) -> str:
    """A Lua string literal (header names and values: printable ASCII)."""
    if not text.isprintable() or not text.isascii():
        raise ValueError(f"not a plain header text: {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _parse_wrk(done: subprocess.CompletedProcess[str]) -> LoadResult:
    line = next((x for x in done.stdout.splitlines() if x.startswith("WRKJSON ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    data = orjson.loads(line.removeprefix("WRKJSON "))
    kinds = ("connect", "read", "write", "status", "timeout")
    errors = sum(data[k] for k in kinds)
    examples = [f"{k} errors: {data[k]}" for k in kinds if data[k]]
    return LoadResult(
        tool="wrk",
        requests=data["requests"] - data["status"],
        errors=errors,
        elapsed_s=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        error_examples=examples,
    )
