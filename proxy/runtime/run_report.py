"""What `agentproxy run` says once the agent is done: the session's figures, as the proxy's
sessions routes report them (turns, context tokens received and sent, the rewrites by stage
and action, cost; an en dash for a model without a price), and how to replay it.

The figures are asked of the proxy the agent used, over HTTP, with the key the agent was
given (a client key sees its own sessions; a proxy without keys answers its local user), so
an embedded proxy and one already running are read alike. A recorded session's timeline is
written by a task after the answers: its last turns may lag the list by a moment, so the
timeline is read again until it holds every turn the list counts (RECORDED_WAIT_S at most).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp

HTTP_TIMEOUT_S = 5.0
RECORDED_WAIT_S = 3.0
TIMELINE_LIMIT = 1000  # turns: the sessions route's most per page
TIMELINE_PAGES = 20  # pages read at most (a page stops at the route's 4 MB)
MAX_BODY_BYTES = 8 * 1024 * 1024  # an answer longer than a page is not the proxy's
UNPRICED = "\u2013"  # an en dash, as the inspector shows a cost it does not know


@dataclass(frozen=True, slots=True)
class Figures:
    turns: int
    tokens_received: int
    tokens_sent: int
    rewrites: Counter[str]
    cost_usd: float
    recorded: bool

    def line(self, session: str) -> str:
        rewrites = ", ".join(f"{name} x{n}" for name, n in sorted(self.rewrites.items()))
        cost = f"${self.cost_usd:.4f}" if self.cost_usd > 0 else UNPRICED
        return (
            f"session {session}: {self.turns} turn{'' if self.turns == 1 else 's'}, "
            f"tokens received {self.tokens_received:,}, "
            f"sent {self.tokens_sent:,}, rewrites: {rewrites or 'none'}, cost {cost}"
        )


def replay_line(session: str, config: str) -> str:
    """The command that replays the session offline, as a shell takes it."""
    return shlex.join(["agentproxy", "replay", "--session", session, "--config", config])


async def session_figures(proxy_url: str, session: str, key: str | None) -> Figures | None:
    """The figures of the session the proxy lists under this name; None when it lists none
    (the agent sent nothing) or cannot be asked."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
            listed = await _get(http, f"{proxy_url}/admin/sessions")
            row = next((r for r in listed.get("data") or [] if r.get("session") == session), None)
            if row is None:
                return None
            events = await _events(http, f"{proxy_url}/admin/sessions/{row['id']}", row)
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
        return None
    return Figures(
        turns=int(row.get("turns") or 0),
        tokens_received=int(row.get("tokens_received") or 0),
        tokens_sent=int(row.get("tokens_sent") or 0),
        rewrites=Counter(f"{e.get('stage')}.{e.get('action')}" for e in events),
        cost_usd=float(row.get("cost_usd") or 0.0),
        recorded=bool(row.get("recorded")),
    )


async def _events(http: aiohttp.ClientSession, url: str, row: dict[str, Any]) -> list[Any]:
    """Every event of the session's timeline, once it holds the turns the list counts."""
    expected = 0  # the board's last turns: there at once
    if row.get("recorded"):
        expected = int(row.get("turns") or 0) - sum((row.get("not_recorded") or {}).values())
    deadline = time.monotonic() + RECORDED_WAIT_S
    while True:
        timeline = await _timeline(http, url)
        if len(timeline) >= expected or time.monotonic() > deadline:
            return [e for turn in timeline for e in turn.get("events") or [] if isinstance(e, dict)]
        await asyncio.sleep(0.1)


async def _timeline(http: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    """The timeline's rows, page after page (TIMELINE_PAGES at most)."""
    rows: list[dict[str, Any]] = []
    after = 0
    for _ in range(TIMELINE_PAGES):
        shown = await _get(http, f"{url}?limit={TIMELINE_LIMIT}&after={after}")
        rows += [row for row in shown.get("timeline") or [] if isinstance(row, dict)]
        if not shown.get("has_more") or not isinstance(shown.get("next_after"), int):
            break
        after = shown["next_after"]
    return rows


async def _get(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    raw = bytearray()
    async with http.get(url) as response:
        response.raise_for_status()
        async for chunk in response.content.iter_chunked(64 * 1024):
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                raise ValueError(f"{url}: answer past {MAX_BODY_BYTES} bytes")
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise ValueError(f"{url}: not an object")
    return body
