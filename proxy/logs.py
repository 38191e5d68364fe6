"""What a client sends never floods the log."""

from __future__ import annotations

import logging

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
