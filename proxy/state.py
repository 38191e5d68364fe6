"""Typed keys for what the application holds; created in app.py, read by routes."""

from __future__ import annotations

import asyncio

from aiohttp import web

from proxy.control.control import Control
from proxy.flow import Flow
from proxy.http.runtime_keys import RuntimeKeys
from proxy.metrics import Metrics
from proxy.model_catalog import ModelCatalog
from proxy.policies.watch import ConfigHolder
from proxy.recording.audit import Audit
from proxy.recording.auth_failures import AuthFailures
from proxy.recording.events import EventLog
from proxy.recording.sessions import TurnWriter
from proxy.sessions.board import SessionBoard
from proxy.sessions.shared_board import SharedBoard
from proxy.sessions.turn_memory import TurnMemory
from proxy.store.base import Store
from proxy.store.health import StoreHealth
from proxy.upstream.facts import DeploymentFacts
from proxy.upstream.pool import Upstreams

CONFIG = web.AppKey("config", ConfigHolder)
METRICS = web.AppKey("metrics", Metrics)
UPSTREAMS = web.AppKey("upstreams", Upstreams)
# What the proxy learnt of its deployments from their answers (proxy/upstream/facts.py).
FACTS = web.AppKey("facts", DeploymentFacts)
CATALOG = web.AppKey("catalog", ModelCatalog)
STORE = web.AppKey("store", Store)
STORE_HEALTH = web.AppKey("store_health", StoreHealth)
CONTROL = web.AppKey("control", Control)
FLOW = web.AppKey("flow", Flow)
# Each session's memory of its last turn, per owner (proxy/sessions/turn_memory.py).
TURN_MEMORY = web.AppKey("turn_memory", TurnMemory)
EVENTS = web.AppKey("events", EventLog)
BOARD = web.AppKey("board", SessionBoard)
SHARED_BOARD = web.AppKey("shared_board", SharedBoard)  # a shared store's only
TIMELINE_READS = web.AppKey("timeline_reads", asyncio.Semaphore)  # pages built at once
RECORDINGS = web.AppKey("recordings", TurnWriter)
# The secret `serve` keeps in its runtime file, for `run` (proxy/runtime/identity.py).
IDENTITY = web.AppKey("identity", str)
# Keys made at run time (proxy/http/runtime_keys.py) and the audit of admin actions.
RUNTIME_KEYS = web.AppKey("runtime_keys", RuntimeKeys)
AUDIT = web.AppKey("audit", Audit)
# Refused admin callers, audited coalesced (proxy/recording/auth_failures.py).
AUTH_FAILURES = web.AppKey("auth_failures", AuthFailures)
