"""A static upstream for benchmarks, OpenAI-compatible (chat and Responses), Anthropic and
Gemini: canned answers, as fast as asyncio allows.

Run as its own process: `python bench/_static_upstream.py [--port N]`. It prints
`listening <port>` on stdout once bound, then answers every `POST /v1/chat/completions`
with a canned chat.completion, every `POST /v1/responses` with a canned Responses API response
and every `POST /v1/messages` with a canned Anthropic message (when the body has
`"stream": true`, a canned SSE stream of any of them), every
`POST /v1beta/models/{model}:generateContent` with a canned Gemini GenerateContentResponse and
every `:streamGenerateContent` with its SSE stream (the action, not the body, says which), over
HTTP/1.1 keep-alive. Everything else gets a 404. All streams carry the same text pieces,
`FIRST_WORD` first.

A raw `asyncio.Protocol` instead of aiohttp's server: the upstream must not be the
bottleneck of the numbers it is a baseline for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import signal
import socket
import sys

import orjson

MODEL = "bench"
CONTENT_PIECES = 10
MAX_HEADER_BYTES = 64 * 1024
STREAM_FLAG = re.compile(rb'"stream"\s*:\s*true')
CHAT_PATH = b"/v1/chat/completions"
MESSAGES_PATH = b"/v1/messages"
RESPONSES_PATH = b"/v1/responses"
GEMINI_MODELS = b"/v1beta/models/"
FIRST_WORD = "word0 "  # the first streamed text piece, every wire: marks the first token


def _words() -> list[str]:
    return [f"word{i} " for i in range(CONTENT_PIECES)]


def completion_body() -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1700000000,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "The answer is 42. " * 4},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 25, "completion_tokens": 20, "total_tokens": 45},
        }
    )


def stream_events() -> list[bytes]:
    """The SSE events of one streamed completion, each ending with its blank line."""

    def chunk(choices: list[object], usage: object = None) -> bytes:
        data: dict[str, object] = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": MODEL,
            "choices": choices,
        }
        if usage is not None:
            data["usage"] = usage
        return b"data: " + orjson.dumps(data) + b"\n\n"

    def delta(content: dict[str, str], finish: str | None = None) -> list[object]:
        return [{"index": 0, "delta": content, "finish_reason": finish}]

    events = [chunk(delta({"role": "assistant", "content": ""}))]
    events += [chunk(delta({"content": word})) for word in _words()]
    events.append(chunk(delta({}, "stop")))
    usage = {"prompt_tokens": 25, "completion_tokens": CONTENT_PIECES, "total_tokens": 35}
    events.append(chunk([], usage))
    events.append(b"data: [DONE]\n\n")
    return events


ANTHROPIC_USAGE = {
    "input_tokens": 25,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
}


def message_body() -> bytes:
    """A canned Anthropic Messages API answer."""
    return orjson.dumps(
        {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [{"type": "text", "text": "The answer is 42. " * 4}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {**ANTHROPIC_USAGE, "output_tokens": 20},
        }
    )


def message_events() -> list[bytes]:
    """The SSE events of one streamed Anthropic message, each ending with its blank line."""

    def event(name: str, data: dict[str, object]) -> bytes:
        return b"event: %s\ndata: %s\n\n" % (name.encode(), orjson.dumps({"type": name, **data}))

    start: dict[str, object] = {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**ANTHROPIC_USAGE, "output_tokens": 1},
    }
    events = [
        event("message_start", {"message": start}),
        event("ping", {}),
        event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    ]
    events += [
        event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": word}})
        for word in _words()
    ]
    events.append(event("content_block_stop", {"index": 0}))
    events.append(
        event(
            "message_delta",
            {
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": CONTENT_PIECES},
            },
        )
    )
    events.append(event("message_stop", {}))
    return events


RESPONSE_ID = "resp_bench0123456789abcdef"
OUTPUT_ID = "msg_bench0123456789abcdef"


def _response(status: str, output: list[object], output_tokens: int | None) -> dict[str, object]:
    """A Responses API response object; usage only once it is done (`output_tokens`)."""
    usage = None
    if output_tokens is not None:
        usage = {
            "input_tokens": 25,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 25 + output_tokens,
        }
    return {
        "id": RESPONSE_ID,
        "object": "response",
        "created_at": 1700000000,
        "status": status,
        "model": MODEL,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "store": False,
        "usage": usage,
    }


def _output_message(text: str | None) -> dict[str, object]:
    """The answer's message item: in progress (no text yet) or completed with `text`."""
    content = [] if text is None else [_output_text(text)]
    status = "in_progress" if text is None else "completed"
    return {
        "type": "message",
        "id": OUTPUT_ID,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _output_text(text: str) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": []}


def response_body() -> bytes:
    """A canned Responses API answer."""
    return orjson.dumps(_response("completed", [_output_message("The answer is 42. " * 4)], 20))


def response_events() -> list[bytes]:
    """The SSE events of one streamed Responses answer (`event:` and `data:` lines, with
    sequence numbers), each ending with its blank line; the last is response.completed."""
    sequence = 0

    def event(name: str, data: dict[str, object]) -> bytes:
        nonlocal sequence
        payload = orjson.dumps({"type": name, **data, "sequence_number": sequence})
        sequence += 1
        return b"event: %s\ndata: %s\n\n" % (name.encode(), payload)

    at = {"item_id": OUTPUT_ID, "output_index": 0, "content_index": 0}
    text = "".join(_words())
    events = [
        event("response.created", {"response": _response("in_progress", [], None)}),
        event("response.in_progress", {"response": _response("in_progress", [], None)}),
        event("response.output_item.added", {"output_index": 0, "item": _output_message(None)}),
        event("response.content_part.added", {**at, "part": _output_text("")}),
    ]
    events += [
        event("response.output_text.delta", {**at, "delta": word, "logprobs": []})
        for word in _words()
    ]
    events += [
        event("response.output_text.done", {**at, "text": text, "logprobs": []}),
        event("response.content_part.done", {**at, "part": _output_text(text)}),
        event("response.output_item.done", {"output_index": 0, "item": _output_message(text)}),
        event(
            "response.completed",
            {"response": _response("completed", [_output_message(text)], CONTENT_PIECES)},
        ),
    ]
    return events


GEMINI_USAGE = {"promptTokenCount": 25, "cachedContentTokenCount": 0}


def _gemini_chunk(text: str, output_tokens: int, finish: bool) -> dict[str, object]:
    """A GenerateContentResponse, whole or one chunk of a stream: every chunk carries the usage
    so far, the last the finish reason."""
    candidate: dict[str, object] = {"content": {"role": "model", "parts": [{"text": text}]}}
    if finish:
        candidate["finishReason"] = "STOP"
    candidate["index"] = 0
    usage = {**GEMINI_USAGE, "candidatesTokenCount": output_tokens}
    usage["totalTokenCount"] = 25 + output_tokens
    return {
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": MODEL,
        "responseId": RESPONSE_ID,
    }


def generate_body() -> bytes:
    """A canned Gemini generateContent answer."""
    return orjson.dumps(_gemini_chunk("The answer is 42. " * 4, 20, True))


def generate_events() -> list[bytes]:
    """The SSE events of one streamed Gemini answer (`data:` lines, one chunk per text piece,
    the last with the finish reason), each ending with its blank line."""
    words = _words()
    return [
        b"data: " + orjson.dumps(_gemini_chunk(word, n + 1, n == len(words) - 1)) + b"\n\n"
        for n, word in enumerate(words)
    ]


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _json_response(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % len(body) + body


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _stream_writes(events: list[bytes]) -> list[bytes]:
    """Head and first event (role chunk; message_start; response.created) in the first write,
    one write per later event, then the end."""
    return [
        STREAM_HEAD + _http_chunk(events[0]),
        *(_http_chunk(event) for event in events[1:]),
        b"0\r\n\r\n",
    ]


# path -> (JSON answer, stream writes)
ANSWERS = {
    CHAT_PATH: (_json_response(completion_body()), _stream_writes(stream_events())),
    MESSAGES_PATH: (_json_response(message_body()), _stream_writes(message_events())),
    RESPONSES_PATH: (_json_response(response_body()), _stream_writes(response_events())),
}
GEMINI_ANSWER = (_json_response(generate_body()), _stream_writes(generate_events()))
NOT_FOUND = (
    b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\nnot found"
)
BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\nConnection: close\r\n\r\nbad request"
)


class StaticHTTP(asyncio.Protocol):
    """HTTP/1.1 keep-alive; Content-Length bodies split over reads; pipelined requests."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None and self._answer_one():
            pass

    def _answer_one(self) -> bool:
        """Answers the first complete request in the buffer; False when there is none yet."""
        assert self.transport is not None
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEADER_BYTES:
                self._fail()
            return False
        head = bytes(self.buffer[:end])
        parsed = _parse_head(head)
        if parsed is None:
            self._fail()
            return False
        method, path, length, close = parsed
        total = end + 4 + length
        if len(self.buffer) < total:
            return False
        body = bytes(self.buffer[end + 4 : total])
        del self.buffer[:total]
        self._respond(method, path, body)
        if close or self.transport.is_closing():
            self.transport.close()
            self.transport = None
            return False
        return True

    def _respond(self, method: bytes, path: bytes, body: bytes) -> None:
        assert self.transport is not None
        route = path.split(b"?", 1)[0]
        answer = ANSWERS.get(route) if method == b"POST" else None
        streamed = answer is not None and STREAM_FLAG.search(body) is not None
        if method == b"POST" and answer is None and route.startswith(GEMINI_MODELS):
            action = route.rpartition(b":")[2]
            if action in (b"generateContent", b"streamGenerateContent"):
                answer, streamed = GEMINI_ANSWER, action == b"streamGenerateContent"
        if answer is None:
            self.transport.write(NOT_FOUND)
        elif streamed:
            for piece in answer[1]:
                if self.transport.is_closing():  # the client hung up mid-stream
                    return
                self.transport.write(piece)
        else:
            self.transport.write(answer[0])

    def _fail(self) -> None:
        assert self.transport is not None
        self.transport.write(BAD_REQUEST)
        self.transport.close()
        self.transport = None


def _parse_head(head: bytes) -> tuple[bytes, bytes, int, bool] | None:
    """(method, path, content length, close after) or None when unusable (e.g. chunked)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        return None
    method, path, version = parts
    length = 0
    close = version != b"HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            if not value.strip().isdigit():
                return None
            length = int(value)
        elif name == b"transfer-encoding":
            return None
        elif name == b"connection":
            token = value.strip().lower()
            close = token == b"close" or (close and token != b"keep-alive")
    return method, path, length, close


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(StaticHTTP, host, port, backlog=1024)
    sock: socket.socket = server.sockets[0]
    print(f"listening {sock.getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args()
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print("refusing to listen anywhere but loopback", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
