"""Typed keys for what the application holds; created in app.py, read by routes."""

from __future__ import annotations

import asyncio

from aiohttp import web

from proxy.control.control import Control
from proxy.flow import Flow
from proxy.metrics import Metrics
from proxy.model_catalog import ModelCatalog
from proxy.policies.watch import ConfigHolder
from proxy.recording.events import EventLog
from proxy.recording.sessions import TurnWriter
from proxy.runtime.handover import Handover
from proxy.sessions.board import SessionBoard
from proxy.store.base import Store
from proxy.store.health import StoreHealth
from proxy.upstream.pool import Upstreams
from proxy.wire.anthropic.thinking import RelayedThinking
from proxy.wire.view_memo import ViewMemo

CONFIG = web.AppKey("config", ConfigHolder)
METRICS = web.AppKey("metrics", Metrics)
UPSTREAMS = web.AppKey("upstreams", Upstreams)
CATALOG = web.AppKey("catalog", ModelCatalog)
STORE = web.AppKey("store", Store)
STORE_HEALTH = web.AppKey("store_health", StoreHealth)
CONTROL = web.AppKey("control", Control)
FLOW = web.AppKey("flow", Flow)
VIEWS = web.AppKey("views", ViewMemo)
# The thinking blocks relayed to each session, to put back what a client drops.
RELAYED_THINKING = web.AppKey("relayed_thinking", RelayedThinking)
EVENTS = web.AppKey("events", EventLog)
HANDOVER = web.AppKey("handover", Handover)
BOARD = web.AppKey("board", SessionBoard)
TIMELINE_READS = web.AppKey("timeline_reads", asyncio.Semaphore)  # pages built at once
RECORDINGS = web.AppKey("recordings", TurnWriter)
# The secret `serve` keeps in its runtime file, for `run` (proxy/runtime/identity.py).
IDENTITY = web.AppKey("identity", str)
