"""Graceful shutdown of `agentproxy serve`: on SIGTERM no new connections, streams in flight
run to their end within server.drain_s, then exit 0; past the deadline they are cut."""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import openai
import pytest

from proxy import cli
from tests.conftest import free_port, sim_config
from tests.test_cli import start_serve

WORDS = 30  # the simulator echoes them back, one chunk each


def refused(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=0.5):
            return False
    except OSError:
        return True


async def stream_text(client: openai.AsyncOpenAI, began: asyncio.Event) -> tuple[str, bool]:
    """The streamed answer, and whether it ended properly (a finish_reason came)."""
    ask = " ".join(f"w{n}" for n in range(WORDS))
    text, finished = "", False
    try:
        stream = await client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": ask}], stream=True
        )
        async for chunk in stream:
            began.set()
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.choices and chunk.choices[0].finish_reason:
                finished = True
    except openai.APIError:
        pass  # cut: what arrived so far is the answer
    return text, finished


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
async def test_sigterm_lets_a_stream_in_flight_finish_then_exits_0(
    tmp_path: Path, slow_simulator: str, event_loop: str
) -> None:
    """On either event loop (`server.event_loop`; uvloop is the `speed` extra)."""
    config = tmp_path / "agentproxy.yaml"
    server = f"server: {{drain_s: 20, event_loop: {event_loop}}}\n"
    config.write_text(sim_config(slow_simulator) + f"store: {{path: {tmp_path}}}\n{server}")
    process, url = await start_serve(config)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    began = asyncio.Event()
    streaming = asyncio.create_task(stream_text(client, began))
    await asyncio.wait_for(began.wait(), 10)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)

    for _ in range(100):  # the listener closes at once
        if refused(url):
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("still accepting connections after SIGTERM")
    assert process.returncode is None, "it must not exit while the stream runs"

    text, finished = await asyncio.wait_for(streaming, 20)
    assert finished and text == "You said: " + " ".join(f"w{n}" for n in range(WORDS))
    _, stderr = await asyncio.wait_for(process.communicate(), 10)
    assert process.returncode == 0, stderr.decode()
    assert time.monotonic() - signalled > 2, "the stream took its time; so did the exit"
    assert "1 request(s) in flight get up to 20s to finish" in stderr.decode()
    assert f"serving on the {event_loop} event loop" in stderr.decode()


async def test_past_drain_s_a_stream_is_cut_and_the_process_still_exits_0(
    tmp_path: Path, slow_simulator: str
) -> None:
    config = tmp_path / "agentproxy.yaml"
    config.write_text(
        sim_config(slow_simulator) + f"store: {{path: {tmp_path}}}\nserver: {{drain_s: 0.5}}\n"
    )
    process, url = await start_serve(config)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    began = asyncio.Event()
    streaming = asyncio.create_task(stream_text(client, began))
    await asyncio.wait_for(began.wait(), 10)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = await asyncio.wait_for(process.communicate(), 10)
    exited_after = time.monotonic() - signalled
    text, finished = await asyncio.wait_for(streaming, 10)
    assert process.returncode == 0, stderr.decode()
    assert exited_after < 2.5, f"exited {exited_after:.1f}s after SIGTERM with drain_s 0.5"
    assert not finished and len(text.split()) < WORDS


def test_uvloop_asked_for_but_missing_refuses_to_start_saying_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "uvloop" else real_find_spec(name, *a),
    )
    config = tmp_path / "agentproxy.yaml"
    config.write_text(
        sim_config("http://127.0.0.1:9")
        + f"store: {{path: {tmp_path}}}\nserver: {{event_loop: uvloop}}\n"
    )
    assert cli.main(["serve", "--config", str(config), "--port", str(free_port())]) == 2
    assert "pip install 'agentproxy[speed]'" in capsys.readouterr().err


async def test_a_kept_alive_connection_is_answered_during_the_drain_and_told_to_close(
    tmp_path: Path, slow_simulator: str
) -> None:
    """A client whose idle connection was kept alive sends on it after SIGTERM (while a stream
    drains): it gets its answer, with `Connection: close`, rather than a connection closed
    under it; then the process exits 0 as ever."""
    config = tmp_path / "agentproxy.yaml"
    config.write_text(sim_config(slow_simulator) + f"store: {{path: {tmp_path}}}\n")
    process, url = await start_serve(config)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    ask = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as kept:
        async with kept.post(url + "/v1/chat/completions", json=ask) as first:
            assert first.status == 200 and "Connection" not in first.headers
            await first.read()
        began = asyncio.Event()
        streaming = asyncio.create_task(stream_text(client, began))
        await asyncio.wait_for(began.wait(), 10)
        process.send_signal(signal.SIGTERM)
        for _ in range(100):  # draining once the listener is closed
            if refused(url):
                break
            await asyncio.sleep(0.02)
        async with kept.post(url + "/v1/chat/completions", json=ask) as during:
            assert during.status == 200 and during.headers["Connection"] == "close"
            assert (await during.json())["choices"][0]["message"]["content"]
    _, finished = await asyncio.wait_for(streaming, 20)
    assert finished
    await asyncio.wait_for(process.communicate(), 10)
    assert process.returncode == 0
