"""Credentials in URLs are hidden wherever a URL is shown; where it points stays visible."""

from __future__ import annotations

import pytest

from proxy.redaction import redact_url, redact_urls_in, without_traceback


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://127.0.0.1:9911/v1", "http://127.0.0.1:9911/v1"),
        ("https://user:pass@api.example.com/v1", "https://***@api.example.com/v1"),
        ("https://sk-only@api.example.com/v1", "https://***@api.example.com/v1"),
        ("redis://:hunter2@10.0.0.5:6379/0", "redis://***@10.0.0.5:6379/0"),
        ("redis://:p@ss/w@10.0.0.5:6379/0", "redis://***@10.0.0.5:6379/0"),  # raw @ and /
        ("unix://:pw@/run/redis.sock?db=2", "unix://***@/run/redis.sock?db=2"),
        ("https://h.example/v1?api-key=s3cret", "https://h.example/v1?api-key=***"),
        (
            "https://h.example/v1?key=a&token=b&sig=c",
            "https://h.example/v1?key=***&token=***&sig=***",
        ),
        (
            "https://h.example/v1?api-version=2024-06-01&k=x",
            "https://h.example/v1?api-version=2024-06-01&k=***",
        ),
        ("https://h.example/v1?sk-bare", "https://h.example/v1?***"),
        ("https://h.example/v1#access_token=x", "https://h.example/v1#***"),
        ("https://h.example/v1?", "https://h.example/v1?"),
        # Malformed values reach config errors too: never a strict parse.
        ("htp//user:pw@h.example/v1?token=x", "htp//***@h.example/v1?token=***"),
        ("user:pw@h.example:8000/v1", "***@h.example:8000/v1"),
        ("http://[::1/v1?sig=x", "http://[::1/v1?sig=***"),
        # An "@" after "?" or "#": a password with "?" or a query with "@"; either way, hidden.
        ("redis://:p?ss@10.0.0.5/0", "redis://***"),
        ("https://h.example/v1?key=sec@ret", "https://***"),
        ("", ""),
    ],
)
def test_redact_url_hides_userinfo_and_query_secrets(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_urls_inside_free_text_are_redacted() -> None:
    text = "302, message='', url=URL('https://u:p@h.example/v1?key=s') then http://a:b@c/d."
    assert redact_urls_in(text) == (
        "302, message='', url=URL('https://***@h.example/v1?key=***') then http://***@c/d."
    )
    assert redact_urls_in("no url here: a@b") == "no url here: a@b"


def test_tracebacks_and_source_paths_never_reach_a_message() -> None:
    quoted = (
        "litellm.APIConnectionError: bad tool\nTraceback (most recent call last):\n"
        '  File "/srv/venv/lib/python3.11/site-packages/litellm/main.py", line 6083, in x\n'
    )
    assert without_traceback(quoted) == "litellm.APIConnectionError: bad tool"
    named = 'failed in File "/srv/app/proxy/flow.py", line 12 (see C:\\app\\x.pyc)'
    assert without_traceback(named) == "failed in [source] (see [source])"
    assert without_traceback("model gpt.pyramid failed") == "model gpt.pyramid failed"
