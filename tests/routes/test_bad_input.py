"""Bad input gets the documented status and an OpenAI-style body, and the proxy keeps serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory, base_url, sim_config

GOOD_KEY = "sk-proxy-good"
LIMIT = 4096
GOOD = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def guarded(start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer) -> TestServer:
    path = tmp_path / "c.yaml"
    extra = f"""
    server:
      max_body_bytes: {LIMIT}
    keys:
      api_keys:
        - name: tester
          key: {GOOD_KEY}
        - name: limited
          key: sk-proxy-limited
          models: [other]
    """
    path.write_text(
        sim_config(str(sim_server.make_url("")).rstrip("/"), extra, more_models=("other",))
    )
    return await start_proxy(path)


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


CASES = [
    ("truncated JSON", b'{"model": "sim", "messages": [', {}, 400, None),
    ("empty body", b"", {}, 400, None),
    ("array body", b"[1, 2]", {}, 400, None),
    ("model not a string", dumps({**GOOD, "model": 5}), {}, 400, None),
    ("messages not an array", dumps({**GOOD, "messages": "hi"}), {}, 400, None),
    ("empty messages", dumps({**GOOD, "messages": []}), {}, 400, None),
    ("unknown role", dumps({**GOOD, "messages": [{"role": "robot", "content": "x"}]}), {}, 400,
     None),
    ("content wrong type", dumps({**GOOD, "messages": [{"role": "user", "content": 3}]}), {}, 400,
     None),
    ("tool without id", dumps({**GOOD, "messages": [{"role": "tool", "content": "x"}]}), {}, 400,
     None),
    ("stream not a bool", dumps({**GOOD, "stream": "yes"}), {}, 400, None),
    ("negative max_tokens", dumps({**GOOD, "max_tokens": -1}), {}, 400, None),
    ("non-UTF-8", b'{"model": "sim", "messages": [{"role": "user", "content": "\xff\xfe"}]}', {},
     400, None),
    ("huge body", dumps({**GOOD, "pad": "x" * (LIMIT * 4)}), {}, 413, "request_too_large"),
    ("unknown model", dumps({**GOOD, "model": "gpt-nope"}), {}, 404, "model_not_found"),
    ("missing key", dumps(GOOD), {"Authorization": ""}, 401, "invalid_api_key"),
    ("wrong key", dumps(GOOD), {"Authorization": "Bearer sk-wrong"}, 401, "invalid_api_key"),
    ("model not allowed for key", dumps(GOOD), {"Authorization": "Bearer sk-proxy-limited"}, 403,
     None),
    ("unknown policy header", dumps(GOOD), {"x-agentproxy-policy": "nope"}, 400,
     "policy_not_found"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
async def test_bad_input_then_good_input(
    guarded: TestServer, body: bytes, headers: dict[str, str], status: int, code: str | None
) -> None:
    url = base_url(guarded) + "/chat/completions"
    auth = {"Authorization": f"Bearer {GOOD_KEY}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=body, headers={**auth, **headers}) as r:
            assert r.status == status, await r.text()
            error = (await r.json())["error"]
            assert error["message"] and error["type"]
            assert error["request_id"] == r.headers["x-request-id"]
            if code:
                assert error["code"] == code
        async with http.post(url, json=GOOD, headers=auth) as r:
            assert r.status == 200


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/nothing", 404),
        ("GET", "/v1/chat/completions", 405),
        ("POST", "/v1/embeddings", 404),
        ("POST", "/chat/completions", 404),  # the /v1 prefix missing from a base URL
    ],
)
async def test_unknown_routes_answer_openai_style_and_list_the_routes_served(
    guarded: TestServer, method: str, path: str, status: int
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, str(guarded.make_url(path))) as r:
            assert r.status == status
            error = (await r.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert f"{method} {path} is not served" in error["message"]
    for served in ("POST /v1/chat/completions", "POST /v1/messages", "POST /v1/responses"):
        assert served in error["message"]


async def test_streaming_bad_upstream_before_first_byte_is_json_error(
    guarded: TestServer,
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            base_url(guarded) + "/chat/completions",
            json={**GOOD, "model": "gpt-nope", "stream": True},
            headers={"Authorization": f"Bearer {GOOD_KEY}"},
        ) as r,
    ):
        assert r.status == 404
        assert r.content_type == "application/json"


async def test_a_bug_inside_the_proxy_is_an_openai_style_500(
    guarded: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy.flow import Flow

    async def crash(*args: Any) -> None:
        raise RuntimeError("boom")

    url = base_url(guarded) + "/chat/completions"
    auth = {"Authorization": f"Bearer {GOOD_KEY}"}
    async with aiohttp.ClientSession() as http:
        with monkeypatch.context() as patch:
            patch.setattr(Flow, "complete", crash)
            async with http.post(url, json=GOOD, headers=auth) as r:
                assert r.status == 500
                error = (await r.json())["error"]
                assert error["type"] == "internal_error"
                assert r.headers["x-request-id"] in error["message"]
                assert "boom" not in error["message"]  # internals stay in the log
        async with http.post(url, json=GOOD, headers=auth) as r:
            assert r.status == 200
