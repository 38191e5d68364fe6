"""`agentproxy serve | validate | simulate | demo | replay | store | run`; `--log-level` before
or after the command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Sequence

from proxy import __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    code: int = args.run(args)
    return code


def _global_flags(parser: argparse.ArgumentParser, default: str | None) -> None:
    """Flags that go before or after the command; a command's copy only sets what it is given
    (SUPPRESS), so it never hides the same flag given before the command."""
    parser.add_argument(
        "--log-level",
        default=argparse.SUPPRESS if default is None else default,
        choices=["debug", "info", "warning", "error"],
        help="what to log [info]",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentproxy",
        description="An OpenAI-compatible proxy that repairs, compacts and governs agent traffic.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"agentproxy {__version__}",
        help="print the version and exit",
    )
    _global_flags(parser, "info")
    common = argparse.ArgumentParser(add_help=False)
    _global_flags(common, None)
    commands = parser.add_subparsers(required=True, metavar="COMMAND", help="what to do")

    serve = commands.add_parser(
        "serve",
        parents=[common],
        help="run the proxy",
        description="Run the proxy, on a configuration (--config) or on one model (--model).",
    )
    source = serve.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="a YAML file or a folder of YAML files")
    source.add_argument(
        "--model",
        metavar="PROVIDER/NAME",
        help="serve this one model, e.g. openai/gpt-4o-mini, with the default policies: its "
        "key from the environment (OPENAI_API_KEY, ...), any model name clients send",
    )
    serve.add_argument(
        "--api-base", metavar="URL", help="with --model: the provider's API [its default]"
    )
    serve.add_argument("--host", help="address to listen on [server.host, else 127.0.0.1]")
    serve.add_argument("--port", type=int, help="port to listen on [server.port, else 4000]")
    serve.add_argument(
        "--workers",
        default="1",
        metavar="N",
        help="processes serving the port: a number, or auto for one per core [1]; more than "
        "one needs store.backend: redis",
    )
    serve.set_defaults(run=_serve)

    validate = commands.add_parser(
        "validate", parents=[common], help="check configuration files and exit"
    )
    validate.add_argument(
        "paths", nargs="+", metavar="PATH", help="a YAML file or a folder; each one configuration"
    )
    validate.set_defaults(run=_validate)

    simulate = commands.add_parser(
        "simulate", parents=[common], help="run the simulated OpenAI-compatible model"
    )
    simulate.add_argument("--host", default="127.0.0.1", help="address to listen on [127.0.0.1]")
    simulate.add_argument("--port", type=int, default=9911, help="port to listen on [9911]")
    # Claude Code and Codex open with 9-19k tokens: the default serves them (the demo and the
    # tests that show compaction give their simulator a small window of their own).
    simulate.add_argument(
        "--context-window", type=int, default=200_000, help="tokens the model takes [200000]"
    )
    simulate.add_argument("--api-key", help="require this key from callers")
    simulate.add_argument(
        "--chunk-delay", type=float, default=0.0, help="seconds between streamed chunks"
    )
    simulate.set_defaults(run=_simulate)

    demo = commands.add_parser(
        "demo", parents=[common], help="drive a tool-using agent through the proxy"
    )
    demo.add_argument(
        "--proxy",
        metavar="URL",
        help="drive a running proxy (alias 'sim' on a simulator) instead of starting one",
    )
    demo.add_argument("--api-key", default="demo", help="the key to send with --proxy [demo]")
    demo.add_argument(
        "--rounds", type=int, default=1, help="agent sessions to run with --proxy [1]"
    )
    demo.set_defaults(run=_demo)

    replay = commands.add_parser(
        "replay",
        parents=[common],
        help="run a recorded session or a JSONL trace through a policy, offline",
        description="Run traces (one turn a line: docs/cli.md; several: each on its own, then "
        "their totals) or a recorded session through the real proxy offline: the upstream "
        "answers from the trace, the summarizer is a deterministic stand-in (unless --live). "
        "Prints per turn and in total the tokens received and sent, each rewrite, the "
        "prompt-cache hit ratio, the cost, the summaries prepared ahead (used, wasted) and "
        "whether every request was valid for the provider (and why not).",
    )
    replay.add_argument("trace", nargs="*", metavar="FILE.jsonl",
                        help="traces to replay, each on its own (then their totals)")  # fmt: skip
    replay.add_argument(
        "--session", metavar="ID", help="a recorded session instead (with --config)"
    )
    replay.add_argument("--config", help="the configuration to replay with (for --session: the "
                        "one the proxy runs with) [the demo's policies]")  # fmt: skip
    replay.add_argument("--key", metavar="NAME", help="whose session / which key's policies, "
                        "when keys are configured [--session: the owner that has it; a "
                        "trace: the first key]")  # fmt: skip
    replay.add_argument("--policy", metavar="NAME", help="the policy to apply [as selected]")
    replay.add_argument("--against", metavar="NAME", help="a second policy, side by side")
    replay.add_argument("--json", action="store_true", help="print one JSON object")
    replay.add_argument("--live", metavar="ALIAS", help="summarize with this alias of --config "
                        "for real instead of the stand-in")  # fmt: skip
    replay.set_defaults(run=_replay)

    store = commands.add_parser(
        "store",
        parents=[common],
        help="look after the store: its size, a collection now",
        description="The store's size and sessions (stats), or a collection now (gc): "
        "sessions idle past store.session_ttl deleted, whole sessions evicted down to "
        "store.max_mb, never a live one. Safe while the proxy runs.",
    )
    store.add_argument("action", choices=["stats", "gc"],
                       help="stats: size and sessions; gc: delete expired sessions and "
                       "evict down to store.max_mb now (safe while the proxy runs)")  # fmt: skip
    store.add_argument("--config", required=True, help="the configuration the proxy runs with")
    store.add_argument("--json", action="store_true", help="print JSON")
    store.set_defaults(run=_store)

    run = commands.add_parser(
        "run",
        parents=[common],
        help="start an agent pointed at the proxy: agentproxy run -- claude|codex|CMD ...",
        description="Start an agent already pointed at the proxy: Claude Code "
        "(ANTHROPIC_BASE_URL), Codex (a temporary CODEX_HOME whose provider is the proxy) or "
        "any command (OPENAI_BASE_URL, ANTHROPIC_BASE_URL). Uses the proxy answering on "
        "--port, else starts one in this process for as long as the agent runs. Prints "
        "where the inspector shows the session; exits with the agent's exit code.",
    )
    upstream = run.add_mutually_exclusive_group()
    upstream.add_argument(
        "--config", help="the proxy's configuration: the proxy answering on its server.port "
        "is used, else one is started with it"
    )  # fmt: skip
    upstream.add_argument(
        "--model", metavar="PROVIDER/NAME",
        help="start a proxy serving this one model, as `serve --model` does",
    )  # fmt: skip
    upstream.add_argument(
        "--simulate", action="store_true",
        help="start a proxy on the built-in simulated model (offline; to try it out)",
    )  # fmt: skip
    run.add_argument("--api-base", metavar="URL", help="with --model: the provider's API")
    run.add_argument("--port", type=int,
                     help="where the proxy is, or is started [server.port, else 4000; "
                     "a started one: a free port]")  # fmt: skip
    run.add_argument("--key", help="the proxy API key to send [AGENTPROXY_API_KEY]")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                     help="the agent: claude, codex, or any command")  # fmt: skip
    run.set_defaults(run=_run)
    return parser


def _serve(args: argparse.Namespace) -> int:
    import socket

    from proxy.app import build_app
    from proxy.logs.lines import say, use_format
    from proxy.policies.loader import ConfigError, load_config
    from proxy.policies.single_model import single_model_config
    from proxy.runtime import heap, identity, workers
    from proxy.runtime.handover import discard
    from proxy.runtime.listen import ListenError
    from proxy.runtime.recycle import RECYCLE_EXIT
    from proxy.runtime.server import CHOOSE_PORT, run, serve
    from proxy.runtime.startup import startup_refusal
    from proxy.store.base import StoreError

    if args.api_base is not None and args.model is None:
        print("agentproxy serve: --api-base goes with --model", file=sys.stderr)
        return 2
    try:
        config = single_model_config(args.model, args.api_base) if args.model else (
            load_config(args.config)
        )  # fmt: skip
        count = workers.workers_from(args.workers)
    except ConfigError as exc:
        print(f"agentproxy: invalid configuration, not starting:\n{exc}", file=sys.stderr)
        return 2
    except ValueError:
        print(f"agentproxy: --workers {args.workers}: a number of 1 or more, or auto",
              file=sys.stderr)  # fmt: skip
        return 2
    log_format = config.server.log_format  # read at start: every line from here on in it
    use_format(log_format)
    if refused := workers.refusal(config, count) or startup_refusal(config):
        say(f"agentproxy: {refused}; not starting", log_format, error=True)
        return 2
    # Before any fork, and before the app's first large block.
    logging.getLogger("agentproxy").info(heap.pin_mmap_threshold(config.server.mmap_threshold_kb))
    host = args.host or config.server.host
    port = args.port or config.server.port
    served = (
        f"model {args.model}, as '{config.catch_all}' and any other name"
        if args.model
        else f"config {config.version}, {len(config.deployments)} models"
    )
    root = f"http://{host}:{port}"
    banner = (  # said once listening: each address answers while this line is true
        f"agentproxy {__version__} on {root}/v1 ({served})\n"
        f"  inspector {root}/ui   metrics {root}/metrics"
    )
    drain_s = config.server.drain_s  # read at start, like the port
    event_loop = config.server.event_loop

    max_rss_mb = config.server.max_rss_mb  # read at start: a ceiling needs a parent
    parented = count > 1 or max_rss_mb is not None
    secret, claimed = identity.new_secret(), []

    def listening() -> None:
        """`agentproxy run` may use this proxy from now on: the runtime file proves it ours."""
        try:
            claimed.append(identity.claim(port, secret))
        except OSError as exc:
            say(f"agentproxy: the runtime file for `agentproxy run` was not written ({exc}): "
                "`run` will not use this proxy", log_format, error=True)  # fmt: skip

    def serve_one(sock: socket.socket | None, tell: Callable[[str], None], replacing: bool) -> int:
        current = config
        if replacing and args.config:  # the files as they are now, like a reload
            try:
                current = load_config(args.config)
            except ConfigError as exc:
                say(f"agentproxy: the configuration is invalid now, this worker starts with the "
                    f"one the process started with:\n{exc}", log_format, error=True)  # fmt: skip
        app = build_app(args.config, config=current, handle_sighup=True, host=host,
                        handover=parented, identity=secret)  # fmt: skip
        try:  # ready once listening: start-up checks the store first
            serving = serve(
                app, host, port, drain_s=drain_s, sock=sock, max_rss_mb=max_rss_mb,
                ready=lambda: tell(workers.READY), leaving=lambda: tell(workers.LEAVING),
            )  # fmt: skip
            recycled = run(serving, event_loop)
        except (StoreError, ListenError) as exc:  # start-up: the store (app.py), the port
            say(f"agentproxy: {exc}; not starting", log_format, error=True)
            return 2
        except KeyboardInterrupt:  # before the signal handlers are in place (start-up)
            return 130
        return RECYCLE_EXIT if recycled else 0

    def ready(event: str) -> None:
        listening()
        say(banner, log_format)

    try:
        if not parented:
            return serve_one(None, ready, False)
        try:
            return workers.run(count, host, port, serve_one, banner,
                               say=lambda text: say(text, log_format), ready=listening)  # fmt: skip
        except OSError as exc:  # the port: taken, or not ours to bind
            say(f"agentproxy: {ListenError(host, port, exc, CHOOSE_PORT)}; not starting",
                log_format, error=True)  # fmt: skip
            return 2
        finally:
            discard(config.store.path)
    finally:
        for path in claimed:
            identity.release(path, secret)


def _store(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from proxy.policies.loader import ConfigError, load_config
    from proxy.store import commands
    from proxy.store.base import StoreError

    try:
        settings = load_config(args.config).store
    except ConfigError as exc:
        print(f"agentproxy store: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    try:
        if args.action == "stats":
            found = asyncio.run(commands.stats(settings))
            out, lines = found.describe(), commands.describe_stats(found, settings)
        else:
            done = asyncio.run(commands.collect(settings))
            out, lines = dataclasses.asdict(done), commands.describe_collected(done)
    except StoreError as exc:
        print(f"agentproxy store: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2) if args.json else "\n".join(lines))
    return 0


def _replay(args: argparse.Namespace) -> int:
    from proxy.replay.command import run

    # The report is the output; per-request log lines would only interleave with it.
    with _quieter(logging.ERROR, "agentproxy", "aiohttp.access"):
        return run(args)


@contextlib.contextmanager
def _quieter(level: int, *names: str) -> Iterator[None]:
    """These loggers at `level` for the command, as they were after (main() may be called
    in-process: a test, an embedding program)."""
    loggers = [logging.getLogger(name) for name in names]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, was in zip(loggers, before, strict=True):
            logger.setLevel(was)


def _validate(args: argparse.Namespace) -> int:
    from proxy.policies.exposure import exposure_warnings
    from proxy.policies.loader import validate_paths
    from proxy.runtime.startup import startup_refusals

    errors, warnings = validate_paths(
        args.paths, also_warn=exposure_warnings, also_refuse=startup_refusals
    )
    for line in warnings:
        print(f"warning: {line}")
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    if errors:
        print(f"{len(errors)} error(s); configuration rejected", file=sys.stderr)
        return 1
    print(f"ok: {', '.join(args.paths)}")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from proxy.runtime.listen import ListenError
    from proxy.sim.simulator import Simulator, serve_simulator

    sim = Simulator(
        context_window=args.context_window, api_key=args.api_key, chunk_delay_s=args.chunk_delay
    )
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_simulator(args.host, args.port, sim))
    except ListenError as exc:
        print(f"agentproxy simulate: {exc}; not starting", file=sys.stderr)
        return 2
    return 0


def _run(args: argparse.Namespace) -> int:
    from proxy.runtime.run_agent import RunOptions, run_agent

    if args.api_base is not None and args.model is None:
        print("agentproxy run: --api-base goes with --model", file=sys.stderr)
        return 2
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    options = RunOptions(
        command=command, config=args.config, model=args.model, api_base=args.api_base,
        simulate=args.simulate, port=args.port, key=args.key,
    )  # fmt: skip
    try:
        return run_agent(options)
    except KeyboardInterrupt:  # before the agent started: it forwards signals from then on
        return 130


def _demo(args: argparse.Namespace) -> int:
    from proxy.sim.demo import run_against, run_demo

    # The demo narrates what happens (its hot reload included); per-request log lines and the
    # audit's JSON would only interleave with it.
    for name in ("agentproxy.access", "agentproxy.config", "agentproxy.audit", "httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)

    if args.proxy:
        if not 1 <= args.rounds <= 1000:
            print("agentproxy demo: --rounds must be between 1 and 1000", file=sys.stderr)
            return 2
        import openai

        try:
            return asyncio.run(run_against(args.proxy.rstrip("/"), args.api_key, args.rounds))
        except openai.APIConnectionError:
            print(f"agentproxy demo: no proxy answers at {args.proxy}", file=sys.stderr)
        except openai.APIStatusError as error:
            print(f"agentproxy demo: {args.proxy} answered {error.status_code}: {error.message}",
                  file=sys.stderr)  # fmt: skip
        return 1
    # On a terminal the proxy stays up after the story, for the addresses it printed.
    return asyncio.run(run_demo(linger=sys.stdin.isatty() and sys.stdout.isatty()))
