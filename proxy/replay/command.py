"""`agentproxy replay`: read the turns, replay them (twice with --against), print."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from proxy.policies.loader import ConfigError
from proxy.replay import report
from proxy.replay.config import ReplayConfigError, Served, replay_config
from proxy.replay.engine import SESSION, first_difference, replay
from proxy.replay.session import SessionError, session_turns
from proxy.replay.trace import TraceError, read_trace

PROGRESS_FROM = 20  # turns: a shorter trace replays before a bar would help


class ReplayError(Exception):
    pass


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except (TraceError, SessionError, ReplayConfigError, ReplayError) as exc:
        print(f"agentproxy replay: {exc}", file=sys.stderr)
    except ConfigError as exc:
        print(f"agentproxy replay: invalid configuration:\n{exc}", file=sys.stderr)
    return 2


async def _run(args: argparse.Namespace) -> int:
    if bool(args.trace) == (args.session is not None):
        raise ReplayError("give a trace FILE.jsonl (or several) or --session ID (one of them)")
    key_name = args.key
    sources: list[tuple[str, list[dict[str, Any]], str]] = []  # (named, turns, session)
    if args.session is not None:
        if args.config is None:
            raise ReplayError("--session needs --config: the configuration the proxy runs with")
        turns, key_name = await session_turns(args.config, args.session, args.key)
        sources.append((f"session {args.session}", turns, args.session))
    else:  # every file read and checked before anything runs
        sources += [(path, read_trace(path), SESSION) for path in args.trace]

    def config_for(turns: list[dict[str, Any]]) -> Callable[[str, str], Served]:
        return lambda upstream, store: replay_config(
            turns, args.config, upstream, store, key_name=key_name, live=args.live
        )

    policies = [args.policy] + ([args.against] if args.against else [])
    _check_policies(config_for(sources[0][1]), policies)
    replays: list[report.Replayed] = []
    total = sum(len(turns) for _, turns, _ in sources) * len(policies)
    with _progress(total, quiet=args.json) as advance:
        for source, turns, session in sources:
            runs = [
                await replay(turns, config_for(turns), policy, advance, session)
                for policy in policies
            ]
            against = None
            if args.against:
                against = (args.against, runs[1], first_difference(runs[0], runs[1]))
            replays.append(report.Replayed(source, args.policy, runs[0], against))
    if args.json:
        print(json.dumps(report.as_json_all(replays), indent=2))
    else:
        report.print_all(_console(), replays)
    return 0


def _check_policies(make_config: Callable[[str, str], Served], names: list[str | None]) -> None:
    """An unknown policy is refused before anything runs (the proxy would answer 400)."""
    config = make_config("http://127.0.0.1:9", "/nonexistent").config
    known = [p.name for p in config.policies]
    for name in names:
        if name is not None and name not in known:
            raise ReplayError(f"unknown policy {name!r}; one of {', '.join(known) or 'none'}")


def _console() -> Any:
    from rich.console import Console

    # Piped output keeps whole rows: a table is not cut at 80 columns.
    return Console(width=None if sys.stdout.isatty() else 200)


def _progress(total: int, quiet: bool) -> Any:
    """A bar on stderr for a long replay, when stderr is a terminal and output is not JSON."""
    if quiet or total < PROGRESS_FROM or not sys.stderr.isatty():
        return nullcontext(lambda: None)
    return _Bar(total)


class _Bar:
    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import Progress

        self.progress = Progress(console=Console(stderr=True), transient=True)
        self.task = self.progress.add_task("replaying", total=total)

    def __enter__(self) -> Callable[[], None]:
        self.progress.start()
        return lambda: self.progress.advance(self.task)

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()
