"""Logging: what a client sends never floods the log, and lines in the format asked for."""

from __future__ import annotations

import logging
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
            line.update(fields)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def use_format(log_format: str) -> None:
    """Every handler of the root logger writes `log_format` ("text" or "json") from now on."""
    if log_format != "json":
        return
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonLines())
