"""What litellm receives of a body (tests/upstream/test_body_steering.py attacks it over a
socket; these pin the list and the shape checks)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from proxy.errors import BadRequest
from proxy.policies.spec import Deployment
from proxy.upstream.litellm_request import BODY_FIELDS, completion_arguments

DEPLOYMENT = Deployment(
    "claude",
    "anthropic/claude-x",
    "anthropic",
    "claude-x",
    "http://127.0.0.1:9",
    "sk-configured",
    litellm_params={"model": "anthropic/claude-x", "api_base": "http://127.0.0.1:9",
                    "api_key": "sk-configured", "max_tokens": 256, "rpm": 10},
)  # fmt: skip


def test_only_request_fields_pass_and_the_deployment_decides_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="agentproxy.litellm")
    body: dict[str, Any] = {
        "model": "claude",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "max_tokens": 64,
        "reasoning_effort": "low",
        "base_url": "http://127.0.0.1:1",
        "api_base": "http://127.0.0.1:1",
        "api_key": "sk-client",
        "litellm_logging_obj": object(),
        "mock_response": "fake",
    }
    arguments = completion_arguments(DEPLOYMENT, body, stream=False)
    assert arguments == {
        "messages": body["messages"],
        "temperature": 0.2,
        "max_tokens": 256,  # the deployment's setting wins over the body's
        "reasoning_effort": "low",
        "api_base": "http://127.0.0.1:9",
        "api_key": "sk-configured",
        "model": "anthropic/claude-x",
        "stream": False,
        "num_retries": 0,
        "max_retries": 0,
    }
    assert "api_base" in caplog.text and "mock_response" in caplog.text
    assert "litellm_logging_obj" in caplog.text


def test_no_call_setting_is_a_body_field() -> None:
    steering = {"api_base", "base_url", "api_key", "api_version", "custom_llm_provider",
                "extra_headers", "headers", "extra_body", "timeout", "mock_response",
                "metadata", "deployment_id", "organization", "model", "stream"}  # fmt: skip
    assert not steering & BODY_FIELDS
    assert not any(name.startswith("litellm") for name in BODY_FIELDS)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": "x"}, "tools"),
        ({"tools": ["x"]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": "x"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"parameters": {}}}]},
         "tools[0].function.name"),
        ({"tools": [{"function": {"name": "f", "parameters": "oops"}}]},
         "tools[0].function.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "f", "description": 1}}]},
         "tools[0].function.description"),
        ({"functions": [{"name": "f", "parameters": []}]}, "functions[0].parameters"),
        ({"tool_choice": 3}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": "f"}}, "tool_choice.function"),
        ({"response_format": "json"}, "response_format"),
    ],
)  # fmt: skip
def test_shapes_litellm_would_crash_on_are_refused_by_name(
    fields: dict[str, Any], param: str
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(BadRequest) as refused:
        completion_arguments(DEPLOYMENT, body, stream=False)
    assert refused.value.param == param


def test_well_formed_tools_pass() -> None:
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
        {"type": "web_search_preview"},  # other tool kinds are litellm's to judge
    ]
    body = {"messages": [], "tools": tools, "tool_choice": {"type": "function",
            "function": {"name": "f"}}, "response_format": {"type": "json_object"}}  # fmt: skip
    assert completion_arguments(DEPLOYMENT, body, stream=False)["tools"] == tools
