"""Throughput of `agentproxy serve --workers N` at concurrency 64, for each N given.

One static upstream (bench/_static_upstream.py) in its own process; for each N a proxy with
the Redis store (more than one worker needs it: guard state must be shared; one worker runs
on it too, so the rows compare the same work) and a fresh key prefix, loaded with wrk at c=64
with the tiny chat body, after a warm-up. Redis must answer on 127.0.0.1:6379; the keys written
are deleted afterwards. Traffic goes to 127.0.0.1 only; every process started is stopped.

    python bench/workers.py                     # N = 1, 2; 10 s each
    python bench/workers.py --workers 1,2,4 --seconds 20 --json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _payloads
import orjson
import redis
from _load import wrk_load, wrk_path
from overhead import (
    CHAT_PATH,
    REPO_ROOT,
    WIRES,
    Processes,
    cpu_s,
    free_port,
    start_upstream,
    wait_ready,
    write_config,
)

REDIS_URL = "redis://127.0.0.1:6379/0"
CONCURRENCY = 64
WARMUP_S = 2


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def run_one(procs: Processes, workers: int, upstream_port: int, seconds: float) -> dict[str, Any]:
    prefix = f"agentproxy-bench-{uuid.uuid4().hex[:8]}:"
    with tempfile.TemporaryDirectory(prefix="agentproxy-workers-") as tmp:
        config = write_config(Path(tmp), upstream_port)
        config.write_text(
            config.read_text()
            + f"store: {{backend: redis, url: '{REDIS_URL}', prefix: '{prefix}'}}\n"
        )
        port = free_port()
        log_path = Path(tmp) / "proxy.log"
        command = [sys.executable, "-m", "proxy", "serve", "--config", str(config),
                   "--port", str(port), "--workers", str(workers)]  # fmt: skip
        with log_path.open("wb") as log:
            started = time.perf_counter()
            child = procs.spawn(
                command,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                cwd=tmp,
                stdout=log,
                stderr=log,
            )
        wait_ready(child, port, started, log_path)
        url = f"http://127.0.0.1:{port}{CHAT_PATH}"
        body = _payloads.tiny(False)
        wrk_load(url, body, WIRES["chat"], concurrency=CONCURRENCY, seconds=WARMUP_S)
        pids = [child.pid, *children_of(child.pid)]
        cpu_before = sum(cpu_s(pid) for pid in pids)
        result = wrk_load(url, body, WIRES["chat"], concurrency=CONCURRENCY, seconds=seconds)
        cpu = sum(cpu_s(pid) for pid in pids) - cpu_before
        child.terminate()
        child.wait(timeout=40)
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
    return {
        "workers": workers,
        "rps": round(result.rps),
        "p50_ms": round(result.p50_ms, 2),
        "p99_ms": round(result.p99_ms, 2),
        "errors": result.errors,
        "cpu_ms_per_request": round(cpu * 1000 / max(1, result.requests), 3),
        "exit_code": child.returncode,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts [1,2]")
    parser.add_argument("--seconds", type=float, default=10.0, help="per run [10]")
    parser.add_argument("--json", action="store_true", help="results as JSON on stdout")
    args = parser.parse_args()
    if wrk_path() is None:
        print("workers.py needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    procs = Processes()
    rows = []
    try:
        upstream_port, _ = start_upstream(procs)
        for workers in (int(n) for n in args.workers.split(",")):
            print(f"--workers {workers}: {args.seconds:g}s at c={CONCURRENCY}", file=sys.stderr)
            rows.append(run_one(procs, workers, upstream_port, args.seconds))
    finally:
        procs.stop_all()
    if args.json:
        print(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"| workers | rps (c={CONCURRENCY}, tiny JSON) | p50 | p99 | CPU ms/request | errors |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['workers']} | {row['rps']:,} | {row['p50_ms']} ms | {row['p99_ms']} ms | "
              f"{row['cpu_ms_per_request']} | {row['errors']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
