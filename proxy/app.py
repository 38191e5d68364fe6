"""Build the aiohttp Application: wiring only, no request logic."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import Any

from aiohttp import web

from proxy.control.control import Control
from proxy.flow import Flow
from proxy.guards.rate_limits import RateLimiter
from proxy.guards.secrets.shared_key import SharedKey
from proxy.http.auth import HOST_NAMES, KEY_PLACES, HostNames
from proxy.http.body_budget import BODY_BUDGET, BodyBudget
from proxy.http.keys import ERROR_BODY, ErrorBody
from proxy.http.middleware import HANDLING, Handling, close_when_draining, proxy_middleware
from proxy.http.runtime_keys import RuntimeKeys
from proxy.logs.lines import log_lines, shorten_protocol_errors
from proxy.metrics import Metrics
from proxy.model_catalog import ModelCatalog
from proxy.pipeline.base import StageContext, forget_sessions
from proxy.pipeline.compaction.summarizer import make_summarizer
from proxy.pipeline.compaction.summary_wire import SummaryWire, SummaryWires
from proxy.pipeline.meter import PromptMeter
from proxy.pipeline.rewriter import MEMO_SHARES, Rewriter
from proxy.policies.exposure import exposure_warnings
from proxy.policies.loader import load_config
from proxy.policies.spec import Config
from proxy.policies.watch import ConfigHolder
from proxy.recording.audit import Audit
from proxy.recording.auth_failures import AuthFailures
from proxy.recording.events import EventLog
from proxy.recording.recorder import Recorder
from proxy.recording.sessions import TurnWriter
from proxy.routes import admin, archive, audit, health, keys, sessions, ui
from proxy.runtime import heap
from proxy.runtime.handover import HANDOVER, Handover
from proxy.runtime.shutdown import close_in_order, stop_task
from proxy.sessions.board import SessionBoard
from proxy.sessions.lineage import Lineage
from proxy.sessions.shared_board import SharedBoard
from proxy.sessions.turn_memory import TurnMemory
from proxy.sim import measure as context_measure
from proxy.state import (
    AUDIT,
    AUTH_FAILURES,
    BOARD,
    CATALOG,
    CONFIG,
    CONTROL,
    EVENTS,
    FACTS,
    FLOW,
    IDENTITY,
    METRICS,
    RECORDINGS,
    RUNTIME_KEYS,
    SHARED_BOARD,
    STORE,
    STORE_HEALTH,
    TIMELINE_READS,
    TURN_MEMORY,
    UPSTREAMS,
)
from proxy.store.activity import Activity
from proxy.store.backends import open_admin_records, open_backends, open_windows
from proxy.store.base import StoreError
from proxy.store.collector import Collector
from proxy.store.health import StoreHealth
from proxy.store.state import MemoryState
from proxy.tracing import open_tracing
from proxy.upstream.facts import DeploymentFacts
from proxy.upstream.pool import Upstreams
from proxy.wire.base import ErrorFrames, key_places
from proxy.wire.models import model_list_routes
from proxy.wire.registry import WIRES as REGISTRY

log = logging.getLogger("agentproxy")

# How the HTTP server runs the app, for `serve` and the tests' servers alike. A client that
# hangs up cancels its handler (aiohttp's default is off since 3.9), so the upstream call it
# waited on is closed at once instead of read to its end; the middleware accounts it as 499
# and what the call used is still charged. aiohttp's access log is off: the proxy logs its own.
SERVER_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {"handler_cancellation": True, "access_log": None}
)


def build_app(
    config_path: str | os.PathLike[str] | None,
    *,
    config: Config | None = None,
    watch: bool = True,
    handle_sighup: bool = False,
    host: str | None = None,
    handover: bool = False,
    identity: str | None = None,
) -> web.Application:
    """`config` skips the first load when the caller already has it (the CLI validated it),
    and is the whole configuration when there is no `config_path` (`serve --model`); `host` is
    the address served when the CLI overrides server.host (for the warnings, and a name the
    proxy is called by); `handover`: a
    worker that a parent replaces when it is recycled, taking over its predecessor's guard
    state and leaving its own for its successor (proxy/runtime/handover.py); `identity`: the
    secret of `serve`'s runtime file, its /healthz's proof to `run` (proxy/runtime/identity.py)."""
    shorten_protocol_errors()
    # Bodies are size-checked against server.max_body_bytes as they are read (it may reload).
    app = web.Application(middlewares=[proxy_middleware], client_max_size=2**63)
    app.on_response_prepare.append(close_when_draining)
    metrics = Metrics()
    if config is None:
        assert config_path is not None, "build_app needs a config path or a config"
        config = load_config(config_path)
    holder = ConfigHolder(config_path, config, metrics)
    natives = [wire.native for wire in REGISTRY if wire.native is not None]
    natives += [native for wire in REGISTRY for native in wire.extra_natives]
    facts = DeploymentFacts()  # learnt of the deployments: this app's alone
    upstreams = Upstreams(lambda: holder.current.server, natives, facts)
    app[METRICS] = metrics
    app[CONFIG] = holder
    app[UPSTREAMS] = upstreams
    app[FACTS] = facts
    app[HANDLING] = Handling()
    app[HOST_NAMES] = HostNames(lambda: holder.current.server, host)
    app[KEY_PLACES] = key_places(REGISTRY)  # where each wire's clients present their key
    # Never below one body of the largest size allowed: that one is always read when alone.
    app[BODY_BUDGET] = BodyBudget(
        lambda: max(
            holder.current.server.max_body_bytes_in_flight, holder.current.server.max_body_bytes
        )
    )
    leaving = app[HANDOVER] = Handover(enabled=handover)
    if identity is not None:  # `serve`'s secret: it proves to `run` whose proxy this is
        app[IDENTITY] = identity
    catalog = app[CATALOG] = ModelCatalog()
    settings = holder.current.store  # where state lives is fixed for the process's life
    store, backend_state, retention = open_backends(settings, metrics, holder.current.keys)
    state = leaving.around(backend_state)  # a replaced worker's: shared with its successor
    if store.shared:  # replicas: what one learns of a deployment, the others know too
        facts.share(state)
    app[STORE] = store
    # Keys made at run time and the audit of admin actions, where the rest is kept.
    admin_records = open_admin_records(settings, backend_state)
    runtime_keys = app[RUNTIME_KEYS] = RuntimeKeys(admin_records, holder)
    auditing = app[AUDIT] = Audit(admin_records, lambda: settings.session_ttl_s)
    holder.on_reload(auditing.reloads)
    refusals = app[AUTH_FAILURES] = AuthFailures(auditing, metrics)
    store_health = app[STORE_HEALTH] = StoreHealth(store, settings.backend)
    events = app[EVENTS] = EventLog(
        settings.event_log_path, settings.event_log_max_mb, settings.event_log_keep
    )
    recorder = Recorder(metrics, events)
    recorder.board = app[BOARD] = SessionBoard()
    if store.shared:  # replicas: each lists the sessions not recorded that any served
        recorder.shared_board = app[SHARED_BOARD] = SharedBoard(store)
    recorder.conversations = {wire.name: wire.conversation for wire in REGISTRY}
    app[TIMELINE_READS] = asyncio.Semaphore(sessions.PAGES_AT_ONCE)
    turns = recorder.turns = app[RECORDINGS] = TurnWriter(
        store,
        metrics,
        recorder.recording_stopped,
        on_unrecorded=recorder.turns_unrecorded,
        assemblies={wire.name: wire.answer_assembly for wire in REGISTRY},
        conversations=recorder.conversations,
        measure=context_measure,  # the one measure replay reports too
    )
    # Control first: the summarizer's calls go through it; the rewriter's hooks are the
    # flow's to offer it, call by call.
    control = app[CONTROL] = Control(upstreams, metrics, state, recorder)
    summarize = make_summarizer(control, metrics, wires=summary_wires(upstreams))
    memo_bytes = holder.current.server.memo_mb * 1024 * 1024  # fixed for the process
    meter = PromptMeter(
        ratios_bytes=int(MEMO_SHARES["token_ratios"] * memo_bytes),
        counts_bytes=int(MEMO_SHARES["token_counts"] * memo_bytes),
    )
    ctx = StageContext(store, catalog, metrics, events, summarize, state, recorder, meter)
    rewriter = Rewriter(
        ctx,
        facts=facts,
        memo_bytes=memo_bytes,
        prepared_summaries=holder.current.server.max_prepared_summaries,  # read at start
    )
    # The guard's placeholders from the deployment's key, kept beside the admin records.
    placeholder_key = SharedKey(admin_records, rewriter.minter)
    turns_memory = app[TURN_MEMORY] = TurnMemory(int(MEMO_SHARES["turn_memory"] * memo_bytes))

    def forget(sessions: set[str]) -> None:  # idle sessions: every memo lets them go
        rewriter.forget(sessions)
        turns.forget(sessions)
        forget_sessions(sessions, named=[turns_memory.cache], led=meter.by_session())

    activity = Activity(
        retention,
        forget,
        live_s=settings.live_s,
        memo_idle_s=holder.current.server.memo_idle_s,  # read at start, as memo_mb is
    )
    collector = Collector(retention, activity, settings, metrics, trim_heap=heap.trim)
    tracing = open_tracing(holder.current.tracing)  # read at start, as the store is
    lineage = Lineage(state, rewriter.chain.histories)  # the chain's memo: one `==` for both
    app[FLOW] = Flow(
        control,
        rewriter,
        store,
        catalog,
        metrics,
        recorder,
        activity,
        lineage,
        tracing,
        settles_inline=isinstance(backend_state, MemoryState),  # its operations never wait
        limiter=RateLimiter(
            open_windows(backend_state, holder.current.server.response_timeout_s),
            metrics,
            recorder,
        ),
    )
    metrics.watch_memos(
        {
            **rewriter.memos(),
            "turn_memory": turns_memory.cache,
            **meter.memos(),
            **(backend_state.memos() if isinstance(backend_state, MemoryState) else {}),
        }
    )
    frames: ErrorBody = ErrorFrames(REGISTRY)  # each error in its matched route's wire
    app[ERROR_BODY] = frames
    for wire in REGISTRY:
        app.add_routes(wire.routes)
    app.add_routes(model_list_routes(REGISTRY))  # lists some wires share (GET /v1/models)
    app.add_routes(admin.routes)
    app.add_routes(keys.routes)
    app.add_routes(audit.routes)
    app.add_routes(health.routes)
    app.add_routes(archive.routes)
    app.add_routes(sessions.routes)
    app.add_routes(ui.routes)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        # A store that takes no writes would only show later, as overflows. A directory does
        # not fix itself; a Redis started alongside the proxy may need a moment.
        try:
            await store_health.require_writable(wait_s=5.0 if settings.backend == "redis" else 0)
        except BaseException:
            await store.close()
            await state.close()
            events.close()
            raise
        # Guard state kept in this process goes from worker to worker when they are recycled.
        tending = None
        if leaving.installed:
            if taken := leaving.attach(settings.path):
                log.info("took over %d guard state entries from the previous worker", taken)
            tending = asyncio.create_task(leaving.tend())
        try:
            await runtime_keys.refresh()  # the keys made at run time, before the first request
        except StoreError as exc:
            log.warning("keys made at run time not read yet (tried again each second): %s", exc)
        keys_following = asyncio.create_task(runtime_keys.follow())
        # Before the first request: a secret then has one placeholder on every replica. A
        # shared store is asked again each minute (the key put back if it went).
        await placeholder_key.load()
        key_following = None
        if store.shared or not placeholder_key.answered:
            key_following = asyncio.create_task(placeholder_key.follow(keep=store.shared))
        holder.on_change(upstreams.prepare)
        upstreams.prepare(holder.current)
        catalog.load_in_background()
        warn_if_open(holder.current, host)
        watching = watch and config_path is not None
        watcher = asyncio.create_task(holder.watch()) if watching else None
        circuits = asyncio.create_task(control.circuits.follow()) if store.shared else None
        facts_following = asyncio.create_task(facts.follow()) if store.shared else None
        collecting = asyncio.create_task(collector.run())
        if handle_sighup:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(
                signal.SIGHUP, lambda: asyncio.ensure_future(holder.reload("sighup"))
            )
        yield
        if handle_sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)

        async def stop_tending() -> None:
            if tending is not None:
                await stop_task(tending)
                leaving.close()  # a leaving worker's last change is in its journal already

        async def export_spans() -> None:
            if tracing is not None:  # the last spans out, off the loop (a bounded HTTP export)
                await asyncio.to_thread(tracing.shutdown)

        board = recorder.shared_board
        refusals.close()  # the summary of refusals counted, not written, on its way
        await close_in_order(
            [
                ("the policy watcher", lambda: stop_task(watcher)),
                ("the circuits' follower", lambda: stop_task(circuits)),
                ("the facts' follower", lambda: stop_task(facts_following)),
                ("the store's collector", lambda: stop_task(collecting)),
                ("the keys' follower", lambda: stop_task(keys_following)),
                ("the placeholder key's follower", lambda: stop_task(key_following)),
                ("the audit's last entries", auditing.settled),
                ("the admin records", admin_records.close),
                ("the last turns recorded", turns.close),  # before the store closes
                # and the last calls of the sessions no recording holds
                *([("the shared board", board.close)] if board is not None else []),
                ("the last requests' activity", activity.flush),
                # summaries written ahead: cancelled before their upstreams
                ("the summaries written ahead", rewriter.close),
                ("the upstream connections", upstreams.close),
                ("the model catalog", catalog.close),
                ("the prompt meter", ctx.meter.close),
                ("the store", store.close),
                ("the facts being published", facts.close),  # before the state closes
                ("the guard state's journal", stop_tending),
                ("the state", state.close),
                ("the spans", export_spans),
            ]
        )
        events.close()

    app.cleanup_ctx.append(lifecycle)
    return app


def warn_if_open(config: Config, host: str | None = None) -> None:
    for warning in exposure_warnings(config, host):
        log_lines(log.warning, warning)
    for warning in config.warnings:
        log_lines(log.warning, f"config: {warning}")
    for note in config.notes:
        log_lines(log.info, f"config: {note}")


def summary_wires(upstreams: Upstreams) -> SummaryWires:
    """The wires a summary can be sent in: each with a native upstream and a one-shot form."""
    return SummaryWires(
        [
            SummaryWire(wire.name, wire.one_shot, upstreams.natives[wire.name].speaks)
            for wire in REGISTRY
            if wire.one_shot is not None and wire.name in upstreams.natives
        ],
        upstreams.facts,
    )
