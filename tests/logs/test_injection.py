"""What a client sends never forges a log line (issue 29 §6): line breaks, escape sequences
and bytes that are not UTF-8, in the path, the query or a header, each logged escaped on the
request's own line. A real `agentproxy serve` process, raw sockets, its stderr read whole."""

from __future__ import annotations

import asyncio
import io
import logging
import re
from pathlib import Path

import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.logs.lines import EscapeControlChars, JsonLines
from tests.conftest import sim_config
from tests.test_cli import start_serve

GOOD = b'{"model":"sim","messages":[{"role":"user","content":"hi"}]}'
FORGED = "FORGED"
# A whole forged access line after the break, as an attacker would write it.
LINE = b"2026-12-04%2000:00:00,000%20INFO%20%20%20%20agentproxy.access:%20FORGED%20GET%20/x%20200"


def raw(head: bytes, body: bytes = b"") -> bytes:
    """One request; the proxy closes the connection after its answer."""
    return (
        head
        + b"Host: localhost\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )


ATTACKS = [
    raw(b"GET /v1/models%0a" + LINE + b" HTTP/1.1\r\n"),
    raw(b"GET /v1/models%0d%0a" + LINE + b"?q=%0a" + LINE + b" HTTP/1.1\r\n"),
    raw(b"GET /v1/%1b[2J%1b[31m" + FORGED.encode() + b"%0d HTTP/1.1\r\n"),
    raw(b"GET /v1/%ff%fe%85%e2%80%a8" + FORGED.encode() + b" HTTP/1.1\r\n"),
    raw(
        b"POST /v1/chat/completions%0a" + LINE + b" HTTP/1.1\r\nContent-Type: application/json\r\n",
        GOOD,
    ),
    raw(  # bytes that are not UTF-8 in headers the proxy reads (the session's is logged)
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
        b"x-agentproxy-session: s-\xff\xfe\xc2\x85\xe2\x80\xa8" + FORGED.encode() + b"\r\n"
        b"User-Agent: agent\xff\xc2\x9b31m" + FORGED.encode() + b"\r\n"
        b"x-request-id: r-\xc2\x85" + FORGED.encode() + b"\r\n",
        GOOD,
    ),
    raw(  # control characters in a header: aiohttp's parser refuses them (400)
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
        b"User-Agent: \x1b]0;" + FORGED.encode() + b"\x07\r\n",
        GOOD,
    ),
    raw(
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n",
        b'{"model":"sim\\n' + LINE + b'","messages":[{"role":"user","content":"hi"}]}',
    ),
]


async def send(port: int, request: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        await asyncio.wait_for(reader.read(), 10)  # the answer, until the proxy closes
        return int(status_line.split()[1])
    finally:
        writer.close()


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_control_characters_from_clients_never_forge_a_log_line(
    tmp_path: Path, sim_server: TestServer, log_format: str
) -> None:
    config = tmp_path / "agentproxy.yaml"
    extra = f"server: {{access_log: true, log_format: {log_format}}}\nstore: {{path: {tmp_path}}}\n"
    config.write_text(sim_config(str(sim_server.make_url("")).rstrip("/"), extra))
    process, url = await start_serve(config)
    port = int(url.rsplit(":", 1)[1])
    try:
        statuses = [await send(port, attack) for attack in ATTACKS]
    finally:
        process.terminate()
        _, raw_stderr = await asyncio.wait_for(process.communicate(), timeout=10)
    assert process.returncode == 0
    assert statuses.count(200) == 1 and statuses.count(400) == 1, statuses
    stderr = raw_stderr.decode("utf-8", "backslashreplace")
    assert "Logging error" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.splitlines()  # splits at \x85, \u2028 and the other separators too
    records = [orjson.loads(line) for line in lines] if log_format == "json" else []
    for line in lines:
        assert line.isprintable(), repr(line)
        assert not line.startswith(("2026-12-04 00:00:00", FORGED, "?q=")), line
        if log_format == "text":  # every line one record of the proxy's own
            assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ", line), line
    # One access line per request the application saw (the 400 never reached it).
    if log_format == "json":
        access = [r["path"] for r in records if r["logger"] == "agentproxy.access"]
        assert all(FORGED not in str(r["message"]).partition(" ")[0] for r in records)
    else:
        access = [line for line in lines if " agentproxy.access: " in line]
    access = [line for line in access if "/readyz" not in line]
    assert len(access) == len(ATTACKS) - 1, access
    assert sum(FORGED in line for line in access) == 5, access
    assert sum("\\n" in line for line in access) == 3
    assert sum(line.count("\\x1b") for line in access) == 2


INJECTED = "2026-12-04 00:00:00 ERROR agentproxy: forged"


@pytest.mark.parametrize("formatter", [logging.Formatter("%(message)s"), JsonLines()])
def test_an_exception_quoting_a_client_stays_on_its_lines(formatter: logging.Formatter) -> None:
    """A traceback keeps its frames on their lines; the exception's own text, which may quote
    what a client sent, cannot start a line of its own (nor, in JSON, lose the record)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(EscapeControlChars())
    handler.setFormatter(formatter)
    log = logging.getLogger("agentproxy.test-injection")
    log.addHandler(handler)
    try:
        try:
            raise ValueError(f"no model 'x\n{INJECTED} line \udcff'")
        except ValueError as exc:
            raise RuntimeError(f"while serving \r\n{INJECTED}") from exc
    except RuntimeError:
        log.exception("request %s failed", f"r\n{INJECTED}")
    finally:
        log.removeHandler(handler)
    written = stream.getvalue()
    assert written.count("forged") == 3
    assert not [line for line in written.splitlines() if line.startswith(INJECTED[:10])]
