"""Logging: what a client sends never floods the log nor forges a line in it, and lines in the
format asked for."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from aiohttp.http_exceptions import HttpProcessingError

PROTOCOL_LOGGER = "aiohttp.server"
MAX_DETAIL_CHARS = 160


class ShortProtocolErrors(logging.Filter):
    """aiohttp logs a request it cannot parse (bytes after `Connection: close`, a malformed
    header...) at ERROR with a traceback whose message quotes up to 128 KB of what the client
    sent: any client could flood the log. Such a record becomes one short WARNING line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        detail = (error.message or type(error).__name__).split("\n", 1)[0].rstrip(":")
        if len(detail) > MAX_DETAIL_CHARS:
            detail = detail[:MAX_DETAIL_CHARS] + "..."
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.msg = "malformed HTTP request from %s refused (%d): %s"
        record.args = (remote, error.code, detail)
        record.exc_info = None
        record.exc_text = None
        record.levelno = logging.WARNING
        record.levelname = logging.getLevelName(logging.WARNING)
        return True


def shorten_protocol_errors() -> None:
    """Installed once per process, whoever builds the app (serve, the tests)."""
    logger = logging.getLogger(PROTOCOL_LOGGER)
    if not any(isinstance(f, ShortProtocolErrors) for f in logger.filters):
        logger.addFilter(ShortProtocolErrors())


def _escape(code: int) -> str:
    named = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code)
    return named or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


# Everything that could end a line, move a terminal's cursor or fail to encode: C0 and C1
# controls, DEL, Unicode's line and paragraph separators, and the lone surrogates that stand for
# bytes that are not UTF-8 in a header (orjson refuses them, and the record would be lost).
_UNSAFE = [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *range(0xD800, 0xE000)]
_ESCAPES = {code: _escape(code) for code in _UNSAFE}


def printable(text: str) -> str:
    """`text` with its control characters escaped (`\\n`, `\\x1b`): one line, whatever a
    client put in it. Text with none (nearly always) is returned as it is."""
    return text if text.isprintable() else text.translate(_ESCAPES)


_PLAIN = frozenset({int, float, bool, type(None)})


def _printable_arg(value: object) -> object:
    if isinstance(value, str):
        return printable(value)
    if value is None or isinstance(value, int | float):
        return value  # %d and %.1f still work
    shown = str(value)  # an exception, a path: what %s would write
    return value if shown.isprintable() else printable(shown)


def log_lines(log: Callable[..., None], text: str) -> None:
    """Log the proxy's own `text` that spans lines (a config warning, a list of errors) as
    those lines: each line's content is escaped as any quoted value is, the breaks between
    them are kept."""
    lines = text.split("\n")
    log("%s" + "\n%s" * (len(lines) - 1), *lines)


class EscapeControlChars(logging.Filter):
    """On every handler: the values a message quotes (a path, a session id, a model name, an
    exception's text: anything a client may have chosen) are written with their control
    characters escaped, so no request can end its line and forge another. The message's own
    text (which the code writes, line breaks included) is left as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple):
            for value in args:  # the common case: nothing to escape, nothing rebuilt
                if not (type(value) in _PLAIN or (isinstance(value, str) and value.isprintable())):
                    record.args = tuple(_printable_arg(value) for value in args)
                    break
        elif isinstance(args, Mapping):
            record.args = {name: _printable_arg(value) for name, value in args.items()}
        if record.exc_info and record.exc_text is None:
            record.exc_text = _traceback(record.exc_info)
        return True


_TRACEBACKS = logging.Formatter()


def _traceback(exc_info: Any) -> str:
    """The traceback as logging writes it, with each exception's own text (which may quote
    what a client sent) escaped; its frames stay on their lines."""
    text = _TRACEBACKS.formatException(exc_info)
    error: BaseException | None = exc_info[1]
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        try:
            message = str(error)
        except Exception:  # a broken __str__: the traceback says so itself
            message = ""
        if message and not message.isprintable():
            text = text.replace(message, printable(message))
        error = error.__cause__ or error.__context__
    return text


class JsonLines(logging.Formatter):
    """`server.log_format: json`: every log record as one JSON object on one line, for a log
    pipeline to parse. A record's `fields` (the access line's) become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "at": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(
                {
                    name: printable(value) if isinstance(value, str) else value
                    for name, value in fields.items()
                }
            )
        if record.exc_info:
            line["error"] = record.exc_text or self.formatException(record.exc_info)
        try:
            return orjson.dumps(line, default=str).decode()
        except orjson.JSONEncodeError:  # text JSON cannot carry (lone surrogates): escaped
            shown = {k: printable(v) if isinstance(v, str) else v for k, v in line.items()}
            return orjson.dumps(shown, default=lambda v: printable(str(v))).decode()


def use_format(log_format: str) -> None:
    """Every handler of the root logger writes `log_format` ("text" or "json") from now on,
    with what clients sent escaped. In json, Python's warnings and an uncaught exception's
    traceback go through them too (they would be written as plain text)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, EscapeControlChars) for f in handler.filters):
            handler.addFilter(EscapeControlChars())
        if log_format == "json":
            handler.setFormatter(JsonLines())
    if log_format == "json":
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught


def _log_uncaught(kind: type[BaseException], error: BaseException, trace: Any) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, error, trace)
        return
    logging.getLogger("agentproxy").critical("uncaught exception", exc_info=(kind, error, trace))


def say(text: str, log_format: str, *, error: bool = False) -> None:
    """A line the process writes outside its log: the start banner (stdout), why it does not
    start (stderr). In `server.log_format: json`, one JSON object like every log line."""
    if log_format == "json":
        level = "error" if error else "info"
        line = {"at": round(time.time(), 3), "level": level, "logger": "agentproxy"}
        try:
            text = orjson.dumps({**line, "message": text}).decode()
        except orjson.JSONEncodeError:  # lone surrogates: escaped, as JsonLines does
            text = orjson.dumps({**line, "message": printable(text)}).decode()
    print(text, file=sys.stderr if error else sys.stdout, flush=True)
