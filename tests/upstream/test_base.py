"""What a client reads when an upstream's error body says nothing usable."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.upstream.base import UpstreamHTTPError, describe
from tests.pipeline.factories import deployment


def test_an_upstream_is_described_without_its_credentials() -> None:
    target = dataclasses.replace(deployment(), api_base="https://user:pw@llm.example/v1?key=s")
    assert describe(target) == "'sim' (openai/sim at https://***@llm.example/v1?key=***)"


@pytest.mark.parametrize(
    ("status", "hint"),
    [
        (400, "check that api_base points at an OpenAI-compatible server"),
        (401, "check the deployment's api_key"),
        (404, "OpenAI-compatible servers usually end in /v1"),
        (500, "it failed on its side (its own log says why)"),
        (418, "its own log says why"),
    ],
)
def test_an_empty_body_still_says_who_answered_and_what_to_check(status: int, hint: str) -> None:
    error = UpstreamHTTPError(status, b"", {}, describe(deployment()))
    message = error.plain_message()
    expected = (
        f"the upstream for 'sim' (openai/sim at http://127.0.0.1:9/v1) answered HTTP {status}"
    )
    assert message.startswith(f"{expected} with an empty body; ")
    assert hint in message


def test_a_text_body_is_quoted() -> None:
    error = UpstreamHTTPError(502, b"<html>Bad Gateway</html>\n", {})
    assert error.plain_message() == (
        "the upstream answered HTTP 502: <html>Bad Gateway</html>; it failed on its side "
        "(its own log says why)"
    )
