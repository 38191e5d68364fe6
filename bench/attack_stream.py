"""How long a long stream's recording holds up the proxy: the worst /healthz latency while a
128k-event stream is relayed and recorded, for each wire (chat, Anthropic, Responses), with
`record` on and off.

Starts an upstream (this file with `--upstream`, a process of its own: an aiohttp server that
streams COUNT tiny text events per request, in writes of 250 events) and the proxy
(`python -m proxy serve`, its store in a temporary directory), then per wire and setting: one
streamed request read to its end while /healthz is polled every 5 ms, and, with `record` on,
until the turn's recording can be read back (GET /admin/sessions/{id}). The figure is the
longest wait for a /healthz answer (the gap between two answers, less the pause between them).

    python bench/attack_stream.py                 # 128,000 events, about a minute
    python bench/attack_stream.py --events 20000

Bounded: at most 1,000,000 events, each run at most RUN_LIMIT_S; all traffic on 127.0.0.1;
every process started is stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from overhead import Processes, _listening, start_proxy

BENCH_DIR = Path(__file__).resolve().parent
MAX_EVENTS = 1_000_000
PER_WRITE = 250
PAUSE_S = 0.005
RUN_LIMIT_S = 120.0
WIRES = {  # wire: (route, alias)
    "chat": ("/v1/chat/completions", "sim"),
    "anthropic": ("/v1/messages", "claude"),
    "responses": ("/v1/responses", "sim"),
}


# --- the upstream ----------------------------------------------------------------------------


def _sse(event: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + orjson.dumps(event) + b"\n\n"


def _piece(n: int) -> str:
    return f"w{n} "


def chat_events(count: int) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _sse({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                     "model": "sim", "choices": [choice]})  # fmt: skip

    body = [chunk({"content": _piece(n)}) for n in range(count)]
    return [
        chunk({"role": "assistant", "content": ""}),
        *body,
        chunk({}, "stop"),
        b"data: [DONE]\n\n",
    ]


def anthropic_events(count: int) -> list[bytes]:
    usage = {"input_tokens": 3, "output_tokens": 1}
    message: dict[str, Any] = {"id": "msg_1", "type": "message", "role": "assistant",
                               "model": "claude-sim", "content": [], "stop_reason": None,
                               "usage": usage}  # fmt: skip
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": 0,
           "delta": {"type": "text_delta", "text": _piece(n)}} for n in range(count)),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
         "usage": {"output_tokens": count}},
        {"type": "message_stop"},
    ]  # fmt: skip
    return [_sse(event, event["type"]) for event in events]


def responses_events(count: int) -> list[bytes]:
    base = {"id": "resp_1", "object": "response", "created_at": 1, "model": "sim",
            "status": "in_progress", "output": []}  # fmt: skip
    text = "".join(_piece(n) for n in range(count))
    item = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
    usage = {"input_tokens": 3, "output_tokens": count, "total_tokens": count + 3}
    done = {**base, "status": "completed", "output": [item], "usage": usage}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "sequence_number": 0, "response": base},
        *({"type": "response.output_text.delta", "sequence_number": n + 1, "item_id": "msg_1",
           "output_index": 0, "content_index": 0, "delta": _piece(n)} for n in range(count)),
        {"type": "response.completed", "sequence_number": count + 1, "response": done},
    ]  # fmt: skip
    return [_sse(event, event["type"]) for event in events]


def serve_upstream(count: int) -> None:
    streams = {
        "/v1/chat/completions": chat_events(count),
        "/v1/messages": anthropic_events(count),
        "/v1/responses": responses_events(count),
    }
    writes = {
        path: [b"".join(events[at : at + PER_WRITE]) for at in range(0, len(events), PER_WRITE)]
        for path, events in streams.items()
    }

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for chunk in writes[request.path]:
            await response.write(chunk)
        await response.write_eof()
        return response

    async def main() -> None:
        app = web.Application()
        for path in writes:
            app.router.add_post(path, stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"listening {port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


# --- the measurement -------------------------------------------------------------------------


def write_config(directory: Path, upstream: int, record: bool) -> Path:
    base = f"http://127.0.0.1:{upstream}"
    text = (
        f"store: {{path: {directory / 'data'}}}\n"
        "model_list:\n"
        f"  - model_name: sim\n    litellm_params: {{model: openai/sim, api_base: {base}/v1}}\n"
        "  - model_name: claude\n"
        f"    litellm_params: {{model: anthropic/claude-sim, api_base: {base}, api_key: sk-up}}\n"
        "policies:\n"
        f"  - name: attack\n    record: {{enabled: {str(record).lower()}}}\n"
    )
    path = directory / ("recorded.yaml" if record else "unrecorded.yaml")
    path.write_text(text)
    return path


async def worst_healthz(http: aiohttp.ClientSession, url: str, done: asyncio.Event) -> float:
    worst, last = 0.0, time.perf_counter()
    while not done.is_set():
        await asyncio.sleep(PAUSE_S)
        async with http.get(url) as response:
            await response.read()
        now = time.perf_counter()
        worst, last = max(worst, now - last - PAUSE_S), now
    return worst


async def recorded(http: aiohttp.ClientSession, base: str, name: str) -> bool:
    ident = base64.urlsafe_b64encode(f"open:/{name}".encode()).decode().rstrip("=")
    async with http.get(f"{base}/admin/sessions/{ident}") as response:
        if response.status != 200:
            return False
        body = await response.json(loads=orjson.loads)
        return bool(body.get("source") == "recording")


async def one_run(base: str, wire: str, record: bool, count: int) -> tuple[float, float]:
    """(worst /healthz wait, seconds from the request to its recording read back)."""
    route, alias = WIRES[wire]
    name = f"attack-{wire}-{'on' if record else 'off'}"
    user = {"role": "user", "content": "talk a lot"}
    body: dict[str, Any] = {"model": alias, "stream": True}
    body |= {"input": [user]} if wire == "responses" else {"messages": [user]}
    if wire == "anthropic":
        body["max_tokens"] = 10
    headers = {"x-agentproxy-session": name, "anthropic-version": "2023-06-01"}
    done = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=RUN_LIMIT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        poll = asyncio.create_task(worst_healthz(http, f"{base}/healthz", done))
        began = time.perf_counter()
        async with http.post(base + route, data=orjson.dumps(body), headers=headers) as response:
            got = await response.read()
        if response.status != 200 or _piece(count - 1).encode() not in got:
            raise SystemExit(f"{wire}: the stream was not relayed whole ({response.status})")
        while record and not await recorded(http, base, name):
            if time.perf_counter() - began > RUN_LIMIT_S:
                raise SystemExit(f"{wire}: not recorded within {RUN_LIMIT_S:g} s")
            await asyncio.sleep(0.05)
        took = time.perf_counter() - began
        await asyncio.sleep(0.3)  # and a moment after
        done.set()
        return await poll, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=128_000)
    parser.add_argument("--upstream", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    count = max(1, min(args.events, MAX_EVENTS))
    if args.upstream:
        serve_upstream(count)
        return
    procs = Processes()
    try:
        command = [sys.executable, str(Path(__file__)), "--upstream", "--events", str(count)]
        upstream, _ = _listening(procs, command, "the streaming upstream")
        rows: list[tuple[str, str, float, float]] = []
        with tempfile.TemporaryDirectory(prefix="attack-stream-") as temp:
            for record in (False, True):
                directory = Path(temp)
                config = write_config(directory, upstream, record)
                proxy = start_proxy(procs, config, directory / f"proxy-{record}.log")
                base = f"http://127.0.0.1:{proxy.port}"
                for wire in WIRES:
                    worst, took = asyncio.run(one_run(base, wire, record, count))
                    rows.append((wire, "on" if record else "off", worst, took))
                    print(f"  {wire:<10} record {rows[-1][1]:<3}  worst /healthz "
                          f"{worst * 1000:8.1f} ms  ({took:.2f} s)", file=sys.stderr)  # fmt: skip
                proxy.process.terminate()
                proxy.process.wait(timeout=10)
        print(f"worst /healthz wait while a {count:,}-event stream is relayed (and recorded)")
        print(f"{'wire':<10} {'record off':>11} {'record on':>11}")
        for wire in WIRES:
            off, on = (w for name, _, w, _ in rows if name == wire)
            print(f"{wire:<10} {off * 1000:9.1f} ms {on * 1000:8.1f} ms")
    finally:
        procs.stop_all()


if __name__ == "__main__":
    main()
