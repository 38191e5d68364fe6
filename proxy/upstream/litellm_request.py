"""What of a client's body litellm receives, and the tool shapes its translation relies on.

litellm's `acompletion` takes the request's fields and its own call settings in one keyword
list: a body holding `api_base`, `base_url`, `api_key`, `custom_llm_provider`, `extra_headers`
or `mock_response` would move the call (with the operator's key) or fake its answer. So litellm
gets only the documented fields of an OpenAI Chat Completions request from the body; where and
how it calls comes from the deployment's configuration alone. What is dropped is logged (debug).

litellm's translation to another provider crashes (a Python error, not an answer) on some
malformed tools and on user content parts of a type it does not know, so their shapes are
checked here first: the client gets a 400 naming the field. (What any provider would refuse is
checked earlier, by the chat request reader: proxy/wire/chat/request.py.)
"""

from __future__ import annotations

import logging
from typing import Any

from proxy.errors import BadRequest
from proxy.json_values import kind
from proxy.policies.spec import Deployment

log = logging.getLogger("agentproxy.litellm")

# OpenAI Chat Completions request fields (platform.openai.com/docs/api-reference/chat/create),
# the legacy functions/function_call, and litellm's documented cross-provider `thinking`.
# Not here on purpose: `model` and `stream` (the proxy sets them), `metadata` (litellm hands it
# to its callbacks and logging), `store` (OpenAI-only storage), and every call setting.
BODY_FIELDS = frozenset(
    {"messages", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
     "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "n", "seed",
     "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
     "response_format", "user", "stream_options", "reasoning_effort", "verbosity", "modalities",
     "audio", "prediction", "service_tier", "web_search_options", "prompt_cache_key",
     "safety_identifier", "thinking"}
)  # fmt: skip

# Keys of litellm_params that are ours or the router's, not completion() arguments.
NOT_COMPLETION_ARGS = frozenset({"model", "rpm", "tpm", "order", "weight", "stream_timeout"})


def completion_arguments(
    deployment: Deployment, body: dict[str, Any], stream: bool
) -> dict[str, Any]:
    """litellm's keyword arguments: the body's request fields, then the deployment's settings."""
    arguments = {k: v for k, v in body.items() if k in BODY_FIELDS}
    if len(arguments) + ("model" in body) + ("stream" in body) < len(body) and log.isEnabledFor(
        logging.DEBUG
    ):
        dropped = sorted(k for k in body if k not in BODY_FIELDS and k not in ("model", "stream"))
        log.debug("'%s': body fields not passed to litellm: %s", deployment.alias, dropped)
    check_shapes(arguments)
    arguments.update(
        (k, v) for k, v in deployment.litellm_params.items() if k not in NOT_COMPLETION_ARGS
    )
    arguments.update(model=deployment.model, stream=stream, num_retries=0, max_retries=0)
    if stream and deployment.stream_timeout_s:
        arguments["timeout"] = deployment.stream_timeout_s
    return arguments


def check_shapes(body: dict[str, Any]) -> None:
    """The shapes litellm's translations index into without checking: a 400 naming the field,
    not a crash inside the proxy."""
    tools = body.get("tools")
    if tools is not None:
        _expect(tools, list, "tools", "an array")
        for i, tool in enumerate(tools):
            where = f"tools[{i}]"
            _expect(tool, dict, where, "an object")
            if tool.get("type", "function") == "function":
                _check_function(tool.get("function"), f"{where}.function")
    functions = body.get("functions")
    if functions is not None:
        _expect(functions, list, "functions", "an array")
        for i, function in enumerate(functions):
            _check_function(function, f"functions[{i}]")
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if "function" in choice:
            _check_function(choice["function"], "tool_choice.function", schema=False)
    elif choice is not None:
        _expect(choice, str, "tool_choice", "a string or an object")
    response_format = body.get("response_format")
    if response_format is not None:
        _expect(response_format, dict, "response_format", "an object")
    for i, message in enumerate(body.get("messages") or ()):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                _check_user_parts(content, f"messages[{i}].content")


# The user content part types litellm translates (litellm.types.llms.openai
# .ValidUserMessageContentTypes); any other makes it raise before the provider is called.
USER_PART_TYPES = frozenset(
    {"text", "image_url", "input_audio", "audio_url", "document", "guarded_text",
     "grounding_source", "query", "video_url", "file"}
)  # fmt: skip


def _check_user_parts(parts: list[Any], where: str) -> None:
    for j, part in enumerate(parts):
        given = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, dict) and not (isinstance(given, str) and given in USER_PART_TYPES):
            error = BadRequest(
                f"'{where}[{j}].type' must be one of {', '.join(sorted(USER_PART_TYPES))} for "
                f"this deployment, not {_shown(given)}",
                param=f"{where}[{j}].type",
            )
            error.unsent = True
            raise error


def _shown(value: Any) -> str:
    return repr(value[:40]) if isinstance(value, str) else kind(value)


def _check_function(function: Any, where: str, *, schema: bool = True) -> None:
    _expect(function, dict, where, "an object")
    _expect(function.get("name"), str, f"{where}.name", "a string")
    if not schema:
        return
    parameters, description = function.get("parameters"), function.get("description")
    if parameters is not None:
        _expect(parameters, dict, f"{where}.parameters", "an object")
    if description is not None:
        _expect(description, str, f"{where}.description", "a string")


def _expect(value: Any, expected: type, where: str, what: str) -> None:
    if not isinstance(value, expected):
        error = BadRequest(f"'{where}' must be {what}, not {kind(value)}", param=where)
        error.unsent = True  # the provider never saw it
        raise error
