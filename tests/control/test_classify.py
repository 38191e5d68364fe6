from __future__ import annotations

import errno

import pytest

from proxy.control.classify import blames_deployment, classify, is_slow
from proxy.control.outcome import CircuitOpen
from proxy.errors import BadRequest, UpstreamBadResponse, UpstreamTimeout, UpstreamUnreachable
from proxy.upstream.base import UpstreamHTTPError

OVERFLOW = b'{"error": {"message": "This model\'s maximum context length is 8192 tokens"}}'


def http(status: int, body: bytes = b"{}") -> UpstreamHTTPError:
    return UpstreamHTTPError(status, body, {})


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 529, 520, 599])
def test_transient_statuses(status: int) -> None:
    assert classify(http(status)) == "transient"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 501, 505])
def test_logical_statuses(status: int) -> None:
    assert classify(http(status)) == "logical"


def test_overflow_is_known_by_its_text_whatever_the_status() -> None:
    assert classify(http(400, OVERFLOW)) == "overflow"
    assert classify(http(413, b"prompt is too long")) == "overflow"
    assert classify(http(400, OVERFLOW), {400: "logical"}) == "overflow"


def test_policy_overrides_per_status() -> None:
    assert classify(http(409), {409: "transient"}) == "transient"
    assert classify(http(503), {503: "logical"}) == "logical"
    assert classify(http(413), {413: "overflow"}) == "overflow"


def test_no_usable_answer_is_transient() -> None:
    assert classify(UpstreamUnreachable("refused")) == "transient"
    assert classify(UpstreamBadResponse("garbled")) == "transient"
    assert classify(UpstreamTimeout("slow")) == "transient"
    assert classify(CircuitOpen("sim", 5, 3.0)) == "transient"


def test_own_resources_are_fatal_and_bugs_have_no_class() -> None:
    assert classify(MemoryError()) == "fatal"
    assert classify(OSError(errno.EMFILE, "Too many open files")) == "fatal"
    assert classify(ValueError("a bug")) is None
    assert classify(BadRequest("not an upstream outcome")) is None


LLAMA_CPP_500 = (
    b"{\"error\":{\"message\":\"1 validation error:\\n  {'type': 'string_type', 'loc': "
    b"('body', 'messages', 1, 'ChatCompletionRequestAssistantMessage', 'content'), 'msg': "
    b'\'Input should be a valid string\', \'input\': None}","type":"internal_server_error"}}'
)


@pytest.mark.parametrize(
    "body",
    [
        LLAMA_CPP_500,
        b'{"detail": [{"type": "missing", "msg": "Field required"}]}',
        b'{"error": {"message": "bad", "type": "invalid_request_error"}}',
    ],
)
def test_a_5xx_blaming_the_request_is_logical(body: bytes) -> None:
    assert classify(http(500, body)) == "logical"
    assert classify(http(503, body)) == "logical"
    assert classify(http(500, body), {500: "transient"}) == "transient"  # the policy decides


def test_a_5xx_saying_nothing_of_the_request_stays_transient() -> None:
    assert classify(http(500, b"Internal Server Error")) == "transient"
    assert classify(http(500, b'{"error": {"message": "boom", "type": "server_error"}}')) == (
        "transient"
    )


def test_which_failures_are_the_deployments_own() -> None:
    for status in (429, 502, 503, 529):
        assert blames_deployment(http(status)) and not is_slow(http(status))
    for status in (500, 520, 599):
        assert not blames_deployment(http(status))  # one bad request can draw these
    assert blames_deployment(UpstreamUnreachable("refused"))
    # A huge prompt can make any provider slow: a timeout may be the request's.
    for slow in (http(408), http(504), UpstreamTimeout("slow")):
        assert not blames_deployment(slow) and is_slow(slow)
