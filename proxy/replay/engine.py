"""One replay: the trace's calls sent, one after the other, to the real proxy app on loopback,
whose every deployment is a simulator answering each call's first request upstream with the
trace's answer (a scripted stand-in when there is none, and for the summarizer) after checking
the request as the provider would. What went upstream is measured per call
(proxy/replay/measure.py)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from aiohttp import web

from proxy.app import SERVER_OPTIONS, build_app
from proxy.exchange import Usage
from proxy.model_catalog import ModelCatalog
from proxy.replay import measure
from proxy.replay.client_turns import numbered
from proxy.replay.config import Served
from proxy.replay.prepared import PreparedCount, PreparedWatch
from proxy.replay.trace import ROUTES
from proxy.sessions.identity import SESSION_HEADER
from proxy.sim.simulator import RecordedRequest, Simulator, run_simulator, same_api
from proxy.state import METRICS
from proxy.wire.registry import WIRES

JSON = dict[str, Any]
SESSION = "replay"  # a trace's turns are one session of the proxy's, by this name
# Served (upstream URL, scratch folder) -> the configuration to replay with.
MakeConfig = Callable[[str, str], Served]


@dataclass
class TurnRow:
    """One model call replayed: `call` its number in the trace, `turn` the client turn (a
    person's prompt) it belongs to, `opens` whether it opens that turn, `side` whether it is a
    side call (a title request beside the conversation: client_turns.py)."""

    call: int
    turn: int
    opens: bool
    wire: str
    model: str
    policy: str
    status: int
    tokens_received: int
    tokens_sent: int
    rewrites: list[JSON]
    cache_read_tokens: int
    cache_write_tokens: int
    cache_hit_ratio: float
    completion_tokens: int
    summarizer_calls: int
    summarizer_tokens: int
    upstream_calls: int
    cost_usd: float | None
    valid: bool
    problems: list[str]
    sent: JSON | None = field(default=None, repr=False)  # the turn's body upstream
    live_status: int | None = None  # what the client got when the turn was recorded
    # Summaries written ahead of a compaction trigger (proxy/replay/prepared.py).
    summaries_prepared: int = 0
    summaries_used: int = 0
    summaries_wasted: int = 0
    side: bool = False

    def count_prepared(self, count: PreparedCount) -> None:
        self.summaries_prepared += count.prepared
        self.summaries_used += count.used
        self.summaries_wasted += count.wasted

    def as_json(self) -> JSON:
        row = {name: getattr(self, name) for name in self.__dataclass_fields__}
        del row["sent"]
        return row


def client_body(turn: JSON) -> JSON:
    """What replay sends for a turn: the request as the client sent it, not streamed (the
    trace's answers are whole)."""
    body = dict(turn["request"])
    if body.get("stream"):
        body["stream"] = False
    body.pop("stream_options", None)
    return body


_WIRES = {wire.name: wire for wire in WIRES}
_JSON_TYPE = {"content-type": "application/json"}


def route_of(turn: JSON) -> str:
    """Where a turn is sent: its wire's model route, naming its model if the route does."""
    return ROUTES[turn["wire"]].replace("{model}", quote(turn["request"]["model"], safe=""))


def parse_applied(header: str | None) -> list[JSON]:
    """`stage.action;count=2;tokens=9000>1500, ...` (proxy/http/headers.py) as records."""
    rewrites = []
    for part in (header or "").split(","):
        name, *fields = part.strip().split(";")
        if not name:
            continue
        stage, _, action = name.partition(".")
        record: JSON = {"stage": stage, "action": action}
        for item in fields:
            key, _, value = item.partition("=")
            if key == "tokens" and ">" in value:
                before, after = value.split(">", 1)
                record["tokens_before"], record["tokens_after"] = int(before), int(after)
            else:
                record[key] = int(value) if value.isdigit() else value
        rewrites.append(record)
    return rewrites


class _Answers:
    """The trace's answer for the turn in flight: given once, to its first call that is not
    the summarizer's (recall rounds and retries after it get the scripted stand-in), if that
    call is in the turn's own wire: a deployment of another (the proxy translating) gets the
    scripted stand-in in its own, as a trace's answer in the client's wire would not parse.
    The summarizer gets the simulator's structured summary, fitted to its max tokens as a
    model that keeps to its instructions would answer, in whatever wire it was asked in."""

    def __init__(self) -> None:
        self.pending: JSON | None = None
        self.route = ""  # the turn's: where its own wire's calls go

    def __call__(self, path: str, body: JSON) -> JSON | None:
        if self.pending is None or measure.is_summary(path, body):
            return None
        answer, self.pending = self.pending, None
        return answer if same_api(path, self.route) else None


async def replay(
    turns: Sequence[JSON],
    make_config: MakeConfig,
    policy: str | None = None,
    advance: Callable[[], None] = lambda: None,
    session: str = SESSION,
) -> list[TurnRow]:
    """`session`: the name the turns are sent under (a recorded session's own: what the
    proxy writes, e.g. an offload's pointer, may name it)."""
    turns = numbered(turns)
    answers = _Answers()
    # The window is the proxy's to fit to; the simulator only checks validity.
    sim = Simulator(context_window=10**9, canned=answers)
    for turn in turns:
        if turn.get("status", 200) < 400:  # signed by the API that accepted it live
            sim.vouch(route_of(turn), turn["request"])
    catalog = ModelCatalog()
    catalog.load_in_background()
    await catalog.ready()
    rows: list[TurnRow] = []
    async with run_simulator(sim) as upstream:
        with tempfile.TemporaryDirectory(prefix="agentproxy-replay-") as folder:
            served = make_config(upstream, folder)
            app = build_app(None, config=served.config, watch=False)
            prepared = PreparedWatch(app[METRICS])
            runner = web.AppRunner(app, **SERVER_OPTIONS)
            await runner.setup()
            try:
                await web.TCPSite(runner, "127.0.0.1", 0).start()
                proxy = f"http://127.0.0.1:{runner.addresses[0][1]}"
                headers = _headers(served, policy, session)
                previous: JSON | None = None
                async with aiohttp.ClientSession() as http:
                    for number, turn in enumerate(turns, 1):
                        answers.pending, answers.route = turn.get("answer"), route_of(turn)
                        start = len(sim.requests)
                        async with http.post(
                            proxy + route_of(turn),
                            data=orjson.dumps(client_body(turn)),
                            headers=_protocol_headers(turn) | headers | _JSON_TYPE,
                        ) as response:
                            status, got = response.status, dict(response.headers)
                            answer = await response.read()
                        row = _row(number, turn, status, got, answer, sim.requests[start:],
                                   previous, served, catalog)  # fmt: skip
                        if sent := sim_sent(sim.requests[start:]):
                            previous = measure.as_chat(sent.path, sent.body)
                        row.count_prepared(prepared.since())
                        rows.append(row)
                        advance()
            finally:
                await runner.cleanup()
                await catalog.close()
    if rows:  # what the stopped app still held: never used
        rows[-1].count_prepared(prepared.since())
    return rows


def _protocol_headers(turn: JSON) -> dict[str, str]:
    """The client's protocol headers: as recorded, else (a recording that kept none) those
    its wire says the request must have come with."""
    if "headers" in turn:
        return dict(turn["headers"] or {})
    return _WIRES[turn["wire"]].replay_headers(turn["request"])


def _headers(served: Served, policy: str | None, session: str) -> dict[str, str]:
    headers = {SESSION_HEADER: session}
    if policy is not None:
        headers["x-agentproxy-policy"] = policy
    if served.secret is not None:
        headers["authorization"] = f"Bearer {served.secret}"
    return headers


def sim_sent(calls: list[RecordedRequest]) -> RecordedRequest | None:
    """The turn's own call upstream: its first that is not the summarizer's."""
    return next((c for c in calls if not measure.is_summary(c.path, c.body)), None)


def _row(
    number: int,
    turn: JSON,
    status: int,
    headers: dict[str, str],
    answer: bytes,
    calls: list[RecordedRequest],
    previous: JSON | None,
    served: Served,
    catalog: ModelCatalog,
) -> TurnRow:
    summaries = [c for c in calls if measure.is_summary(c.path, c.body)]
    sent = sim_sent(calls)
    tokens_sent = measure.prompt_tokens(sent.path, sent.body) if sent else 0
    read = 0
    if sent is not None:
        read = measure.cached_prefix_tokens(
            previous, measure.as_chat(sent.path, sent.body), tokens_sent
        )
    alias = headers.get("x-agentproxy-model") or turn["request"]["model"]
    completion = _completion_tokens(turn["wire"], answer) if status == 200 else 0
    summarizer_tokens = sum(measure.prompt_tokens(c.path, c.body) for c in summaries)
    cost, write = _cost(served, catalog, alias, tokens_sent, read, completion, summarizer_tokens)
    problems = [_refused(c) for c in calls if c.status != 200]
    if status >= 400:
        problems.append(f"the client got {status}: {_error_text(answer)}")
    live = turn.get("status")
    if live is not None and live != status:
        problems.append(f"the client got {status}, {live} live")
    return TurnRow(
        call=number,
        turn=turn["turn"],
        opens=turn["opens"],
        side=turn.get("side") is True,
        wire=turn["wire"],
        model=alias,
        policy=headers.get("x-agentproxy-policy", ""),
        status=status,
        tokens_received=measure.prompt_tokens(route_of(turn), client_body(turn)),
        tokens_sent=tokens_sent,
        rewrites=parse_applied(headers.get("x-agentproxy-applied")),
        cache_read_tokens=read,
        cache_write_tokens=write,
        cache_hit_ratio=round(read / tokens_sent, 4) if tokens_sent else 0.0,
        completion_tokens=completion,
        summarizer_calls=len(summaries),
        summarizer_tokens=summarizer_tokens,
        upstream_calls=len(calls),
        cost_usd=cost,
        valid=all(c.status == 200 for c in calls),
        problems=problems,
        sent=sent.body if sent else None,
        live_status=live,
    )


def _cost(
    served: Served,
    catalog: ModelCatalog,
    alias: str,
    prompt: int,
    read: int,
    completion: int,
    summarizer: int,
) -> tuple[float | None, int]:
    """The turn priced at its model's rates, cached reads and cache writes at theirs (a write
    only where the model charges one: Anthropic's); summarizer prompts at the input rate.
    Returns the cost (None: the model has no price) and the tokens written to the cache."""
    group = served.config.deployments.get(alias)
    if not group:
        return None, 0
    deployment = group[0]
    writes = catalog.facts(deployment).cache_write_cost_per_token is not None
    write = max(0, prompt - read) if writes else 0
    usage = Usage(prompt + summarizer, completion, read, write)
    cost = catalog.cost(deployment, usage)
    return (None if cost is None else round(cost, 8)), write


def _completion_tokens(wire: str, answer: bytes) -> int:
    try:
        data = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return 0
    read = _WIRES[wire].reply_usage(data) if isinstance(data, dict) else None
    return read.completion_tokens if read is not None else 0


def _refused(call: RecordedRequest) -> str:
    """What the simulated provider said of a call it did not answer 200."""
    if call.status is None:
        return f"{call.path}: the connection was dropped"
    said = f": {call.error[:300]}" if call.error else ""
    return f"{call.path} answered {call.status}{said}"


def _error_text(answer: bytes) -> str:
    try:
        error = orjson.loads(answer).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return answer[:200].decode(errors="replace")
    if isinstance(error, dict):
        return str(error.get("message", error))[:300]
    return str(error)[:300]


def first_difference(left: Sequence[TurnRow], right: Sequence[TurnRow]) -> int | None:
    """The first call whose body upstream differs between two replays of one trace."""
    for a, b in zip(left, right, strict=True):
        if _canonical(a.sent) != _canonical(b.sent):
            return a.call
    return None


def _canonical(body: JSON | None) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
