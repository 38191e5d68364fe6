"""Reading and checking a Gemini `generateContent` request body.

Google's REST API reads its JSON with proto3's rules: a field may come in camelCase (what the
SDKs send) or in snake_case. Only what the proxy relies on is checked (contents, parts, function
calls and responses, tools), with the same field paths Google names; every other field passes
through untouched.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import BadRequest
from proxy.json_values import kind
from proxy.wire.body import parse_json_object

# Both spellings of the fields the view reads (camelCase first: the SDKs').
SNAKE = {
    "systemInstruction": "system_instruction",
    "functionCall": "function_call",
    "functionResponse": "function_response",
    "functionDeclarations": "function_declarations",
    "inlineData": "inline_data",
    "fileData": "file_data",
    "cachedContent": "cached_content",
    "mimeType": "mime_type",
    "fileUri": "file_uri",
    "thoughtSignature": "thought_signature",
    "generationConfig": "generation_config",
    "maxOutputTokens": "max_output_tokens",
    "topP": "top_p",
    "stopSequences": "stop_sequences",
    "thinkingConfig": "thinking_config",
    "toolConfig": "tool_config",
    "functionCallingConfig": "function_calling_config",
    "allowedFunctionNames": "allowed_function_names",
    "parametersJsonSchema": "parameters_json_schema",
    "generateContentRequest": "generate_content_request",
    "usageMetadata": "usage_metadata",
}


def field(obj: Any, name: str) -> Any:
    """`obj[name]` in either spelling (None when absent or `obj` is no object)."""
    if not isinstance(obj, dict):
        return None
    value = obj.get(name)
    if value is None and name in SNAKE:
        value = obj.get(SNAKE[name])
    return value


def field_name(obj: dict[str, Any], name: str) -> str:
    """The spelling `obj` uses for `name` (camelCase when it has neither)."""
    snake = SNAKE.get(name)
    return snake if snake is not None and name not in obj and snake in obj else name


def parse_generate_request(raw: bytes, alias: str, *, counting: bool = False) -> dict[str, Any]:
    """The client's body with the model named by the path added (`model`: what the stages,
    the recording and the replay read; never sent on). `counting`: a countTokens request,
    whose body may wrap a whole request in `generateContentRequest`. Each content is checked
    by the view that reads it (check_contents): past what the session's last turn checked."""
    body = parse_json_object(raw)
    if counting:
        wrapped = field(body, "generateContentRequest")
        if isinstance(wrapped, dict):
            body = wrapped
        elif "contents" not in body:
            body = {**body, "contents": []}
    if not alias:
        raise BadRequest("model: the path names no model", param="model")
    contents = body.get("contents")
    if not isinstance(contents, list) or (not contents and not counting):
        raise BadRequest("contents is not specified", param="contents")
    system = field(body, "systemInstruction")
    if system is not None:
        if isinstance(system, str):
            pass  # a bare text: accepted by the API too
        elif not isinstance(system, dict):
            raise BadRequest(f"system_instruction: must be a Content object, not {kind(system)}")
        else:
            _check_parts(system.get("parts"), "system_instruction")
    _check_tools(body.get("tools"))
    for name in ("generationConfig", "toolConfig"):
        value = field(body, name)
        if value is not None and not isinstance(value, dict):
            raise BadRequest(f"{SNAKE[name]}: must be an object, not {kind(value)}")
    return {**body, "model": alias}


def check_contents(contents: list[Any], start: int = 0) -> None:
    """Check `contents[start:]`: the view (view.py) checks only what no earlier turn of the
    session did. A content equal to a checked one passes too: `==` holds between JSON values
    only when their types (dict, list, str) and the lengths of their lists do."""
    for i in range(start, len(contents)):
        check_content(i, contents[i])


def check_content(i: int, content: Any) -> None:
    where = f"contents[{i}]"
    if not isinstance(content, dict):
        raise BadRequest(f"{where}: must be a Content object, not {kind(content)}")
    role = content.get("role")
    if role is not None and not isinstance(role, str):
        raise BadRequest(f"{where}.role: must be a string, not {kind(role)}")
    _check_parts(content.get("parts"), where)


def _check_parts(parts: Any, where: str) -> None:
    if not isinstance(parts, list) or not parts:
        raise BadRequest(f"{where}.parts: must not be empty", param=f"{where}.parts")
    for k, part in enumerate(parts):
        at = f"{where}.parts[{k}]"
        if not isinstance(part, dict):
            raise BadRequest(f"{at}: must be a Part object, not {kind(part)}")
        for name in ("functionCall", "functionResponse"):
            value = field(part, name)
            if value is not None and not (
                isinstance(value, dict) and isinstance(value.get("name"), str)
            ):
                raise BadRequest(f"{at}.{SNAKE[name]}: needs a string 'name'", param=at)
        text = part.get("text")
        if text is not None and not isinstance(text, str):
            raise BadRequest(f"{at}.text: must be a string, not {kind(text)}", param=at)


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise BadRequest(f"tools: must be an array, not {kind(tools)}", param="tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise BadRequest(f"tools[{i}]: must be a Tool object, not {kind(tool)}")
        declarations = field(tool, "functionDeclarations")
        if declarations is None:
            continue
        if not isinstance(declarations, list):
            raise BadRequest(f"tools[{i}].function_declarations: must be an array")
        for k, declaration in enumerate(declarations):
            if not isinstance(declaration, dict) or not isinstance(declaration.get("name"), str):
                raise BadRequest(
                    f"tools[{i}].function_declarations[{k}]: needs a string 'name'",
                    param=f"tools[{i}].function_declarations[{k}].name",
                )
