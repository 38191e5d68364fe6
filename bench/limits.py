"""CPU of the rate limits' check alone, per request: admission and release of one request
through the guard (proxy/guards/rate_limits.py), in process memory and, with `--redis URL`, in
Redis, for 10 keys with their own limits, with a policy's four scopes too, and with none.

    python bench/limits.py                                   # in memory
    python bench/limits.py --redis redis://127.0.0.1:6379/0  # and in Redis (keys deleted after)

No request goes through the HTTP stack here: bench/cpu.py --limits measures the whole turn with
and without limits; this says what the check itself costs, without that run's noise. Each line
is the median of --reps runs of --requests requests, alternated, in CPU µs (time.process_time).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.exchange import Exchange, Identity
from proxy.guards.rate_limits import RateLimiter
from proxy.metrics import Metrics
from proxy.policies.spec import (
    ApiKey,
    Config,
    Policy,
    PolicyLimits,
    RateLimits,
    StoreSettings,
)
from proxy.recording.events import EventLog
from proxy.recording.recorder import Recorder
from proxy.store.windows import MemoryWindows, Windows

# Never reached by the bench: every request pays the whole check.
ROOMY = RateLimits(rpm=10**9, tpm=10**12, max_concurrent=10**6)
KEYS = tuple(ApiKey(f"k{n}", b"-", f"t{n % 3}", None, ROOMY) for n in range(10))
BARE_KEYS = tuple(ApiKey(f"k{n}", b"-", f"t{n % 3}") for n in range(10))
SCOPES = Policy("scoped", limits=PolicyLimits(session=ROOMY, key=ROOMY, team=ROOMY, global_=ROOMY))
PLAIN = Policy("plain")
CASES = {
    "none": (BARE_KEYS, PLAIN),
    "10 keys, own limits": (KEYS, PLAIN),
    "10 keys + 4 policy scopes": (KEYS, SCOPES),
}


def exchange(policy: Policy) -> Exchange:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 30_000}]}
    ex = Exchange(
        identity=Identity("req", owner="key:k0", session="key:k0/s"),
        config=Config(version="b", sources=(), loaded_at=0),
        body=body,
        alias="m",
        policy=policy,
    )
    ex.client.body_bytes = 30_000
    return ex


async def per_request(limiter: RateLimiter, case: str, requests: int) -> float:
    keys, policy = CASES[case]
    ex = exchange(policy)
    started = time.process_time()
    for n in range(requests):
        ex.identity.key = keys[n % len(keys)]
        lease = await limiter.admit(ex)
        if lease is not None:
            await limiter.release(ex, lease)
    return (time.process_time() - started) / requests * 1e6


async def measure(windows: Windows, args: argparse.Namespace) -> dict[str, float]:
    metrics = Metrics()
    limiter = RateLimiter(windows, metrics, Recorder(metrics, EventLog(os.devnull)))
    figures: dict[str, list[float]] = {case: [] for case in CASES}
    for case in CASES:
        await per_request(limiter, case, args.requests // 10)  # warm-up
    for _ in range(args.reps):
        for case in CASES:
            figures[case].append(await per_request(limiter, case, args.requests))
    return {case: statistics.median(values) for case, values in figures.items()}


async def run(args: argparse.Namespace) -> None:
    stores: list[tuple[str, Windows]] = [("memory", MemoryWindows())]
    redis = None
    if args.redis:
        from proxy.store.redis import RedisConnection
        from proxy.store.redis_windows import RedisWindows

        prefix = f"agentproxy-bench-limits-{os.getpid()}:"
        settings = StoreSettings(backend="redis", url=args.redis, prefix=prefix)
        redis = RedisConnection(settings)
        stores.append(("redis", RedisWindows(redis, lease_s=60)))
    try:
        print(f"CPU µs per request, admission + release, median of {args.reps} reps")
        print(f"{'case':<28} " + " ".join(f"{name:>9}" for name, _ in stores))
        results = [await measure(windows, args) for _, windows in stores]
        for case in CASES:
            print(f"{case:<28} " + " ".join(f"{r[case]:9.2f}" for r in results))
    finally:
        if redis is not None:
            found = [k async for k in redis.client.scan_iter(match=redis.prefix + "*")]
            if found:
                await redis.client.delete(*found)
            await redis.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--redis", metavar="URL", help="also in this Redis (127.0.0.1 only)")
    args = parser.parse_args()
    if args.redis and "127.0.0.1" not in args.redis and "localhost" not in args.redis:
        raise SystemExit("--redis: loopback only")
    if args.redis:
        args.requests = min(args.requests, 2_000)  # a round trip each: keep the run short
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
