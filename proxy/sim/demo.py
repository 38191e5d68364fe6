"""`agentproxy demo`: a tool-using agent driven through the real proxy, narrated turn by turn.

Everything runs in this process on loopback: the simulated upstream, the proxy, and an agent
built on the openai SDK with two local tools.
"""

from __future__ import annotations

import asyncio
import json
import signal
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
import openai
from aiohttp import web

from proxy.app import build_app
from proxy.sim.simulator import Fault, Simulator

LOG = "\n".join(
    f"2026-11-30 10:{i // 60:02d}:{i % 60:02d} INFO request {i} served in {3 + i % 7} ms"
    if i != 377
    else "2026-11-30 10:06:17 ERROR database pool exhausted (code E-4417)"
    for i in range(600)
)
PROJECT = {
    "README.md": "# todo-app\nA tiny todo list.\nRun it with `python app.py`.\n",
    "app.py": "todos = []\n\ndef add(item):\n    todos.append(item)\n",
    "server.log": LOG,
}

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name, description in (
        ("list_dir", "List the files in a folder"),
        ("read_file", "Read a file"),
    )
]

TASKS = [
    ('What is in this project? list_dir({"path": "."})', False),
    ('Show me the readme: read_file({"path": "README.md"})', True),
    # 600 log lines: the proxy offloads the result and leaves a pointer with a preview.
    ('Check the server log: read_file({"path": "server.log"})', False),
    # The model reads back what was offloaded; the proxy answers that call itself.
    ('Which error was logged? agentproxy_recall({"query": "ERROR"})', True),
]


def run_tool(name: str, arguments: str) -> str:
    args = json.loads(arguments or "{}")
    if name == "list_dir":
        return "\n".join(sorted(PROJECT))
    if name == "read_file":
        return PROJECT.get(args.get("path", ""), f"error: no file {args.get('path')!r}")
    return f"error: unknown tool {name}"


class Narrator:
    def __init__(self, write: Callable[[str], None] = print) -> None:
        self.write = write

    def line(self, text: str = "") -> None:
        self.write(text)

    def proxy(self, headers: Any, usage: Any) -> None:
        timing = dict(
            part.strip().split(";dur=") for part in headers.get("server-timing", "").split(",")
        )
        tokens = f", tokens {usage.prompt_tokens}→{usage.completion_tokens}" if usage else ""
        policy, model = headers["x-agentproxy-policy"], headers["x-agentproxy-model"]
        self.write(
            f"     proxy: request {headers['x-request-id'][:8]}…  policy={policy}"
            f"  model={model}  own time {timing.get('proxy', '?')} ms"
            f"  (upstream {timing.get('upstream', '?')} ms){tokens}"
        )
        if applied := headers.get("x-agentproxy-applied"):
            self.write(f"     proxy applied: {applied}")


async def _start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


ADMIN_KEY = "demo-admin"  # the inspector asks for it


async def _until_stopped() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _config(sim_url: str, state: Path, aliases: tuple[str, ...] = ("sim",)) -> str:
    models = "".join(
        f"""
          - model_name: {alias}
            litellm_params:
              model: openai/{alias}
              api_base: {sim_url}/v1
            model_info:
              max_input_tokens: 8192"""
        for alias in aliases
    )
    return textwrap.dedent(
        f"""\
        keys:
          admin_key: {ADMIN_KEY}
        store:
          path: {state}
        model_list:{models}
        policies:
          - name: demo
            description: the demo agent's traffic, with a low offload threshold
            match: {{models: [sim]}}
            offload: {{min_tokens: 500, preview_lines: 3}}
            retry: {{base_s: 0.05}}
            record: {{enabled: true}}                  # the inspector shows each turn whole
        """
    )


async def agent_turn(
    client: openai.AsyncOpenAI, history: list[dict[str, Any]], stream: bool, say: Narrator
) -> None:
    """Call the model until it stops asking for tools, running each tool locally."""
    while True:
        raw = await client.chat.completions.with_raw_response.create(
            model="sim",
            messages=cast(Any, history),  # plain dicts are what an agent keeps
            tools=cast(Any, TOOLS),
            stream=stream,
            stream_options={"include_usage": True} if stream else None,
        )
        message, usage = await _read(raw.parse(), stream)
        say.proxy(raw.headers, usage)
        history.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            text = " ".join(str(message["content"]).split())
            say.line(f"  assistant{' (streamed)' if stream else ''}: {text}")
            return
        for call in calls:
            function = call["function"]
            say.line(f"  assistant calls {function['name']}({function['arguments']})")
            result = run_tool(function["name"], function["arguments"])
            say.line(f"  tool {function['name']} → {result.splitlines()[0]!r}…")
            history.append({"role": "tool", "tool_call_id": call["id"], "content": result})


async def _read(parsed: Any, stream: bool) -> tuple[dict[str, Any], Any]:
    if not stream:
        return parsed.choices[0].message.model_dump(exclude_none=True), parsed.usage
    content, usage = "", None
    calls: dict[int, dict[str, Any]] = {}
    async for chunk in parsed:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(
                    delta.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = delta.id or call["id"]
                if delta.function:
                    call["function"]["name"] += delta.function.name or ""
                    call["function"]["arguments"] += delta.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, usage


async def run_demo(write: Callable[[str], None] = print, linger: bool = False) -> int:
    """The demo; with `linger` (a terminal) the proxy stays up after it, for the inspector and
    the metrics whose addresses it printed, until Ctrl-C or SIGTERM."""
    say = Narrator(write)
    started = time.perf_counter()
    sim = Simulator(context_window=8192, chunk_delay_s=0.01)
    sim_runner, sim_url = await _start(sim.app())
    with tempfile.TemporaryDirectory(prefix="agentproxy-demo-") as folder:
        config = Path(folder) / "agentproxy.yaml"
        config.write_text(_config(sim_url, Path(folder) / "state"))
        proxy_runner, proxy_url = await _start(build_app(config))
        try:
            await _narrate(say, sim, sim_url, proxy_url, config)
            if linger:
                say.line(
                    f"\nStill serving: the inspector {proxy_url}/ui (admin key {ADMIN_KEY}) shows "
                    f"this session turn by turn, {proxy_url}/metrics its series. Ctrl-C stops."
                )
                await _until_stopped()
        finally:
            await proxy_runner.cleanup()
            await sim_runner.cleanup()
    say.line(f"\nDemo finished in {time.perf_counter() - started:.1f} s.")
    return 0


async def run_against(
    proxy_url: str, api_key: str, rounds: int, write: Callable[[str], None] = print
) -> int:
    """The agent part of the demo against a running proxy (e.g. `docker compose up`), whose
    alias `sim` is served by a simulator: `rounds` sessions, to give dashboards traffic."""
    say = Narrator(write)
    client = openai.AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key=api_key, max_retries=0)
    for number in range(1, rounds + 1):
        say.line(f"\nSession {number} of {rounds} against {proxy_url}/v1")
        await _agent_session(say, client)
    return 0


async def _agent_session(say: Narrator, client: openai.AsyncOpenAI) -> None:
    """The tasks, then an agent that crashed mid-call, then a request for an unknown model."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use tools to inspect the project."}
    ]
    for number, (task, stream) in enumerate(TASKS, 1):
        say.line(f"\nTurn {number}  user: {task}")
        history.append({"role": "user", "content": task})
        await agent_turn(client, history, stream, say)

    say.line(f"\nTurn {len(TASKS) + 1}  the agent crashed mid-call: write_file never answered")
    history.append(_interrupted_call())
    history.append({"role": "user", "content": "Sorry, I restarted. Where were we?"})
    say.line(f"  user: {history[-1]['content']}")
    await agent_turn(client, history, False, say)
    say.line("\nWhat the proxy does with bad input and a broken upstream:")
    await _show_error(say, "unknown model", _ask(client, model="gpt-nope"))


async def _narrate(
    say: Narrator, sim: Simulator, sim_url: str, proxy_url: str, config: Path
) -> None:
    say.line("AgentProxy demo")
    say.line(f"  simulated model  {sim_url}/v1")
    say.line(f"  proxy            {proxy_url}/v1   (agents set base_url to this)")
    say.line(f"  inspector        {proxy_url}/ui   (admin key {ADMIN_KEY})")
    say.line(f"  metrics          {proxy_url}/metrics")
    client = openai.AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="demo", max_retries=0)
    await _agent_session(say, client)
    sim.inject(Fault(malformed=True))
    raw = await client.chat.completions.with_raw_response.create(
        model="sim", messages=[{"role": "user", "content": "ping"}]
    )
    say.line(f"  garbled upstream once: retried ({raw.headers.get('x-agentproxy-applied')})")
    sim.inject(Fault(malformed=True, times=3))
    await _show_error(say, "garbled upstream, every attempt", _ask(client))
    reply = await _ask(client)
    say.line(f"  next request: {reply.choices[0].message.content!r} — still serving")

    say.line("\nHot reload: adding the alias 'sim-large' to the YAML file…")
    larger = _config(sim_url, config.parent / "state", aliases=("sim", "sim-large"))
    await asyncio.to_thread(config.write_text, larger)
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{proxy_url}/admin/reload", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, json={}
        ) as response:
            outcome = await response.json()
    models = await client.models.list()
    say.line(f"  reload ok={outcome['ok']} version={outcome['version']}")
    say.line(f"  /v1/models now: {', '.join(m.id for m in models.data)}")
    say.line(f"\nThe upstream saw {len(sim.requests)} requests.")


def _interrupted_call() -> dict[str, Any]:
    arguments = json.dumps({"path": "notes.md", "content": "- pool size too small"})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_interrupted",
                "type": "function",
                "function": {"name": "write_file", "arguments": arguments},
            }
        ],
    }


async def _show_error(say: Narrator, label: str, call: Awaitable[Any]) -> None:
    try:
        await call
    except openai.APIStatusError as error:
        body = error.body if isinstance(error.body, dict) else {}
        say.line(f"  {label}: HTTP {error.status_code} {body.get('code')}: {body.get('message')}")


async def _ask(client: openai.AsyncOpenAI, model: str = "sim") -> Any:
    return await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "ping"}]
    )
