"""URLs as they may be shown: in admin output, config errors and warnings, logs, error bodies.

Provider and Redis URLs carry credentials in two places: the userinfo (`user:pass@`,
`redis://:password@`) and the query (`?api-key=`, `?key=`, `?token=`, `?sig=` of a signed URL).
Both are replaced by `***`; scheme, host, port and path stay visible, so a message still says
where. A query value is shown only when its name is on a short list of known-harmless ones:
guessing which names are secret would miss the next provider's spelling.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

HIDDEN = "***"
# Query parameters whose values are settings, never credentials (Azure's api-version, Redis's db).
HARMLESS_QUERY_NAMES = frozenset(
    {"api-version", "api_version", "version", "model", "deployment", "region", "db", "protocol",
     "timeout", "socket_timeout", "ssl_cert_reqs", "decode_responses", "format"}
)  # fmt: skip

# What comes before the authority: "scheme://", or "htp//" in a malformed value, or nothing.
_PREFIX = re.compile(r"^(?:[^/@?#]*//)?")
# A URL inside free text (an exception's message): a scheme, then no whitespace or quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_url(url: str) -> str:
    """`url` with its userinfo, non-harmless query values and fragment replaced by `***`.

    Works on malformed values too (a config error shows them), so it never parses strictly:
    the userinfo is everything up to the last "@" (passwords hold raw "@" and "/"), and when an
    "@" comes after a "?" or "#" nobody can tell a password holding "?" from a query holding
    "@": only the scheme is shown.
    """
    matched = _PREFIX.match(url)
    prefix = matched.group(0) if matched else ""
    rest = url[len(prefix) :]
    at, query_at = rest.rfind("@"), min(_find(rest, "?"), _find(rest, "#"))
    if at > query_at:
        return prefix + HIDDEN
    if at >= 0:
        prefix, rest = f"{prefix}{HIDDEN}@", rest[at + 1 :]
    head, hash_sign, fragment = rest.partition("#")
    base, question_mark, query = head.partition("?")
    if question_mark:
        base += "?" + "&".join(_redact_parameter(item) for item in query.split("&"))
    if hash_sign:
        base += "#" + (HIDDEN if fragment else "")
    return prefix + base


def redact_urls_in(text: str) -> str:
    """Free text (an exception's message) with every URL in it redacted."""
    if "://" not in text:
        return text  # the common case: nothing to look for
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


def _redact_parameter(item: str) -> str:
    name, equals, value = item.partition("=")
    if not item or unquote_plus(name).lower() in HARMLESS_QUERY_NAMES or (equals and not value):
        return item
    return f"{name}={HIDDEN}" if equals else HIDDEN  # a bare "?<token>" is a value too


def _find(text: str, char: str) -> int:
    at = text.find(char)
    return len(text) if at < 0 else at


# A Python traceback quoted in an exception's message (litellm puts one in some of its own),
# and the source paths a message may name: neither may reach a client.
_TRACEBACK = "Traceback (most recent call last)"
_SOURCE_PATH = re.compile(
    r"""(?:File )?["']?(?:[A-Za-z]:)?[\\/][^\s"',:]*\.py[cd]?\b["']?(?:, line \d+)?"""
)


def without_traceback(text: str) -> str:
    """Free text (an error message) with any traceback cut off and source paths removed."""
    at = text.find(_TRACEBACK)
    if at >= 0:
        text = text[:at].rstrip()
    if ".py" not in text:
        return text  # the common case: nothing to look for
    return _SOURCE_PATH.sub("[source]", text)
