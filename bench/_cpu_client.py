"""The load client of bench/cpu.py, in a process of its own (so its CPU is not the served app's).

`python bench/_cpu_client.py BODY_FILE ROUTE CONCURRENCY [--stream] [--keys K1,K2,...]` then
reads lines `URL REQUESTS` on stdin; for each it posts the body REQUESTS times over CONCURRENCY
keep-alive connections with bench/_load.py's aiohttp client (which checks every answer; each
worker sends one of `--keys` in turn) and prints the LoadResult as one JSON line. A client
that stays up: blocks of load cost no process start.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

import orjson
from _load import python_load
from overhead import WIRES


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("body_file")
    parser.add_argument("route", choices=sorted(WIRES))
    parser.add_argument("concurrency", type=int)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--keys", default="", help="API keys the workers send, in turn")
    args = parser.parse_args()
    body = Path(args.body_file).read_bytes()
    for line in sys.stdin:
        url, requests = line.split()
        result = python_load(
            url,
            body,
            WIRES[args.route],
            concurrency=args.concurrency,
            stream=args.stream,
            seconds=600.0,
            max_requests=int(requests),
            keys=tuple(k for k in args.keys.split(",") if k),
        )
        sys.stdout.buffer.write(orjson.dumps(asdict(result)) + b"\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
