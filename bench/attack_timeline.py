"""Reading a long recorded session's timeline: what it costs the proxy (issue 37, item 1).

A simulated model on 127.0.0.1 and a real proxy (`python -m proxy serve`, its own process, the
checkout given by --tree: this one unless told) that records every turn. One session of
--turns turns (500) is driven through it, each turn re-sending the whole history plus one new
~4 KB message (the store holds ~2 MB of it; the bodies re-sent add up to ~1 GB). Then its
timeline is read with bodies (`?full=1`) --reads times (3), one after the other, while
/healthz is polled every 20 ms and the proxy's RSS sampled every 50 ms:

    single   one `GET /admin/sessions/{id}?full=1&limit=1000` a read (what one request costs)
    pages    (--pages) every page of the timeline in turn, following `next_after` (what reading
             all of it costs, a page at a time; a tree without paging answers it all at once)

Printed: the store's bytes, each read's answer bytes and seconds, the proxy's RSS before the
reads and at its peak during them (growth), and the worst /healthz latency measured. Bounded:
loopback only, each read at most --read-timeout seconds, the proxy stopped when its RSS passes
--max-rss-mb; answers are counted as they arrive, never kept.

    python bench/attack_timeline.py                    # this checkout, ~1-2 min
    python bench/attack_timeline.py --tree /work/main  # another checkout's proxy, same load
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as `python bench/attack_timeline.py` from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from proxy.sim.simulator import Simulator  # noqa: E402

HOST = "127.0.0.1"
SESSION = "long-recorded"
NEW_TEXT = 4_000  # bytes of a turn's new message


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def config(sim_url: str, data: Path) -> str:
    return textwrap.dedent(
        f"""\
        store: {{path: {data}}}
        model_list:
          - model_name: sim
            litellm_params: {{model: openai/sim, api_base: "{sim_url}/v1"}}
            model_info: {{max_input_tokens: 50000000}}
        policies:
          - name: recorded
            record: {{enabled: true}}
        """
    )


@contextlib.contextmanager
def proxy_process(
    tree: Path, path: Path, port: int, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "proxy", "serve", "--config", str(path), "--port", str(port)]
    with log.open("wb") as out:
        child = subprocess.Popen(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)  # fmt: skip
    try:
        yield child
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


async def wait_ready(
    http: aiohttp.ClientSession, base: str, child: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError("the proxy exited before it was ready")
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(f"{base}/readyz") as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.05)
    raise RuntimeError("the proxy was not ready within 60 s")


async def recorded(http: aiohttp.ClientSession, base: str) -> int:
    async with http.get(f"{base}/metrics") as r:
        text = await r.text()
    found = re.search(r'agentproxy_recorded_turns_total\{outcome="recorded"\} (\S+)', text)
    return int(float(found.group(1))) if found else 0


async def drive(http: aiohttp.ClientSession, base: str, turns: int) -> None:
    """One session, each turn the whole history and one new message."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
    headers = {"x-agentproxy-session": SESSION}
    started = time.monotonic()
    for turn in range(turns):
        text = f"turn {turn}: " + "".join(
            f"line {turn}.{i} of the tool output\n" for i in range(140)
        )
        history.append({"role": "user", "content": text[:NEW_TEXT]})
        body = {"model": "sim", "messages": history}
        async with http.post(f"{base}/v1/chat/completions", json=body, headers=headers) as r:
            if r.status != 200:
                raise RuntimeError(f"turn {turn}: HTTP {r.status}: {(await r.text())[:300]}")
            history.append((await r.json())["choices"][0]["message"])
        if turn % 100 == 99:
            print(f"  {turn + 1} turns sent, {time.monotonic() - started:.0f} s", flush=True)
    deadline = time.monotonic() + 120
    while await recorded(http, base) < turns:
        if time.monotonic() > deadline:
            raise RuntimeError("the recording did not catch up within 120 s")
        await asyncio.sleep(0.2)


async def read_counting(http: aiohttp.ClientSession, url: str, limit_s: float) -> tuple[int, bytes]:
    """The answer's size; its last 300 bytes (where `next_after` is), nothing else kept."""
    size, tail = 0, b""
    async with http.get(url, timeout=aiohttp.ClientTimeout(total=limit_s)) as r:
        async for chunk in r.content.iter_chunked(1 << 20):
            size += len(chunk)
            tail = (tail + chunk)[-300:]
        if r.status != 200:
            raise RuntimeError(f"GET {url}: HTTP {r.status}: {tail[-200:]!r}")
    return size, tail


async def read_timeline(http: aiohttp.ClientSession, path: str, pages: bool, limit_s: float) -> int:
    """One read with bodies: a single request, or every page following next_after."""
    total, after = 0, 0
    while True:
        size, tail = await read_counting(http, f"{path}?full=1&limit=1000&after={after}", limit_s)
        total += size
        found = re.search(rb'"next_after":(\d+)', tail)
        if not pages or found is None:
            return total
        after = int(found.group(1))


class Watch(threading.Thread):
    """Until stopped, in a thread of its own (the reads keep the bench's loop busy): the worst
    /healthz latency (polled every 20 ms) and the proxy's peak RSS (between polls)."""

    def __init__(self, port: int, pid: int, max_rss: float) -> None:
        super().__init__(daemon=True)
        self.port, self.pid, self.max_rss = port, pid, max_rss
        self.stopped = threading.Event()
        self.healthz_s = 0.0
        self.rss = rss_mb(pid)
        self.error: str | None = None

    def run(self) -> None:
        while not self.stopped.is_set():
            began = time.monotonic()
            connection = http.client.HTTPConnection(HOST, self.port, timeout=60)
            try:
                connection.request("GET", "/healthz")
                connection.getresponse().read()
            except OSError as exc:
                self.error = f"/healthz: {exc}"
            finally:
                connection.close()
            self.healthz_s = max(self.healthz_s, time.monotonic() - began)
            rss = rss_mb(self.pid)
            self.rss = max(self.rss, rss)
            if rss > self.max_rss:
                os.kill(self.pid, signal.SIGKILL)
                self.error = f"the proxy passed --max-rss-mb ({rss:.0f} MB): stopped"
                return
            time.sleep(0.02)


async def main(args: argparse.Namespace, tree: Path) -> None:
    sim = web.AppRunner(Simulator(context_window=50_000_000).app())
    await sim.setup()
    sim_port = free_port()
    await web.TCPSite(sim, HOST, sim_port).start()
    with tempfile.TemporaryDirectory(prefix="attack-timeline-") as folder:
        work = Path(folder)
        path = work / "agentproxy.yaml"
        path.write_text(config(f"http://{HOST}:{sim_port}", work / "data"))
        port = free_port()
        base = f"http://{HOST}:{port}"
        print(f"proxy from {tree}")
        with proxy_process(tree, path, port, work / "proxy.log") as child:
            try:
                async with aiohttp.ClientSession() as http:
                    await wait_ready(http, base, child)
                    await drive(http, base, args.turns)
                    store = sum(f.stat().st_size for f in (work / "data").rglob("*") if f.is_file())
                    async with http.get(f"{base}/admin/sessions") as r:
                        [row] = [s for s in (await r.json())["data"] if s["session"] == SESSION]
                    url = f"{base}/admin/sessions/{row['id']}"
                    print(f"recorded {args.turns} turns; the store's files: {store / 1e6:.2f} MB")
                    before = rss_mb(child.pid)
                    watch = Watch(port, child.pid, args.max_rss_mb)
                    watch.start()
                    mode = "every page" if args.pages else "one request"
                    mode += ", all at once" if args.concurrent else ""

                    async def one(n: int) -> None:
                        began = time.monotonic()
                        size = await read_timeline(http, url, args.pages, args.read_timeout)
                        took = time.monotonic() - began
                        print(
                            f"read {n + 1} ({mode}, ?full=1): {size / 1e6:.1f} MB in {took:.2f} s"
                        )

                    if args.concurrent:
                        await asyncio.gather(*(one(n) for n in range(args.reads)))
                    for n in range(0 if args.concurrent else args.reads):
                        await one(n)
                    watch.stopped.set()
                    watch.join()
            except BaseException:
                print((work / "proxy.log").read_text()[-2000:], file=sys.stderr)
                raise
    await sim.cleanup()
    print(f"proxy RSS before the reads {before:.0f} MB, peak during them {watch.rss:.0f} MB "
          f"(growth {watch.rss - before:.0f} MB)")  # fmt: skip
    print(f"worst /healthz latency during the reads: {watch.healthz_s * 1000:.0f} ms")
    if watch.error:
        print(f"note: {watch.error}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", default=str(REPO_ROOT), help="the checkout whose proxy runs")
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--reads", type=int, default=3)
    parser.add_argument("--pages", action="store_true", help="read every page, not one request")
    parser.add_argument("--concurrent", action="store_true", help="the reads at once")
    parser.add_argument("--read-timeout", type=float, default=300.0)
    parser.add_argument("--max-rss-mb", type=float, default=8000.0)
    arguments = parser.parse_args()
    asyncio.run(main(arguments, Path(arguments.tree).resolve()))
