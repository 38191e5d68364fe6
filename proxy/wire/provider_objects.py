"""Provider-stored objects named by id: refused when tenants share the provider's account.

With API keys configured, every tenant's requests go out under the operator's one provider
account, so any object the provider stores and a request names by id (a file, a vector store,
a code-execution container, a prompt template, a custom skill, a past audio answer) is readable
by whoever knows the id. The
proxy serves no /v1/files, vector stores or containers, so no tenant created one through it,
and it does not record the ones a reply makes: with keys, a request naming one is refused with
a 400 that names the field, before any call upstream. Inline content (an `encrypted_content`
reasoning item, a base64 image, a `{"type": "auto"}` container) goes on as before.

Cheap: the walk covers the tools and only the input items (messages) new on this turn; those
a session's earlier view lent were checked on their own turn (a refused turn's view is not
kept). JSON keys arrive already unescaped, so no spelling slips past.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import BadRequest

# the tools that name stored objects
_HOSTED = frozenset(("code_interpreter", "file_search", "image_generation"))
SHARED_ACCOUNT = (
    "objects stored at the provider are shared by every key of this proxy, so none is named "
    "by id through it"
)


def refuse_responses_objects(body: dict[str, Any], fresh: int) -> None:
    """A Responses request's files, vector stores, containers and prompt templates named by
    id; `fresh`, the first input item not checked on an earlier turn."""
    prompt = body.get("prompt")
    if isinstance(prompt, dict):
        _check_prompt(prompt)
    for index, tool in enumerate(body.get("tools") or ()):  # each a dict: parse saw to it
        if tool.get("type") in _HOSTED:
            _check_tool(tool, f"tools[{index}]")
    items = body.get("input")
    if not isinstance(items, list):
        return
    for index in range(fresh, len(items)):
        item = items[index]
        if not isinstance(item, dict):
            continue
        where = f"input[{index}]"
        for field in ("content", "output"):  # a message's parts, a tool output's parts
            parts = item.get(field)
            if isinstance(parts, list):
                _check_parts(parts, f"{where}.{field}")
            elif isinstance(parts, dict):  # a computer_call_output's screenshot
                _check_parts([parts], f"{where}.{field}", indexed=False)


def _check_prompt(prompt: dict[str, Any]) -> None:
    """A prompt template is stored at the provider and named by id; its variables may name
    files too (named first: the more precise field)."""
    variables = prompt.get("variables")
    if isinstance(variables, dict):
        for name, value in variables.items():
            if isinstance(value, dict) and value.get("file_id") is not None:
                _refuse(f"prompt.variables.{name}.file_id", "files")
    if "id" in prompt:
        _refuse("prompt.id", "a prompt template")


def reasoning_by_id(body: dict[str, Any], fresh: int) -> list[tuple[str, Any]]:
    """The reasoning items, from input item `fresh` on, sent without their `encrypted_content`
    (where, id): the provider looks them up by id, so only the caller's own may go
    (responses_owners.py checks)."""
    items = body.get("input")
    if not isinstance(items, list):
        return []
    return [
        (f"input[{index}]", item.get("id"))
        for index in range(fresh, len(items))
        if isinstance(item := items[index], dict)
        and item.get("type") == "reasoning"
        and item.get("encrypted_content") is None
    ]


def _check_tool(tool: dict[str, Any], where: str) -> None:
    if tool.get("vector_store_ids"):
        _refuse(f"{where}.vector_store_ids", "vector stores")
    container = tool.get("container")
    if isinstance(container, str):
        raise BadRequest(
            f"'{where}.container' names a container by id: it holds the files of whoever ran "
            f'code in it, and {SHARED_ACCOUNT}; use {{"type": "auto"}} instead',
            param=f"{where}.container",
            code="stored_object_refused",
        )
    if isinstance(container, dict) and container.get("file_ids"):
        _refuse(f"{where}.container.file_ids", "files")
    mask = tool.get("input_image_mask")  # image_generation's inpainting mask
    if isinstance(mask, dict) and mask.get("file_id") is not None:
        _refuse(f"{where}.input_image_mask.file_id", "files")


def _check_parts(parts: list[Any], where: str, indexed: bool = True) -> None:
    for index, part in enumerate(parts):
        if isinstance(part, dict) and part.get("file_id") is not None:
            _refuse(f"{where}[{index}].file_id" if indexed else f"{where}.file_id", "files")


def refuse_messages_objects(body: dict[str, Any], fresh: int) -> None:
    """An Anthropic Messages request's container, custom skills and files named by id;
    `fresh`, the first message not checked on an earlier turn."""
    container = body.get("container")
    if isinstance(container, str) or (isinstance(container, dict) and "id" in container):
        raise BadRequest(
            f"'container' names a code execution container by id: it holds the files of "
            f"whoever ran code in it, and {SHARED_ACCOUNT}; leave it out for a new one",
            param="container",
            code="stored_object_refused",
        )
    skills = container.get("skills") if isinstance(container, dict) else None
    if isinstance(skills, list):
        for index, skill in enumerate(skills):
            # Anthropic's own skills (pptx, xlsx...) are no tenant's; any other is uploaded.
            if not isinstance(skill, dict) or skill.get("type") != "anthropic":
                _refuse(f"container.skills[{index}]", "a custom skill")
    messages = body["messages"]  # a list: parse_messages_request saw to it
    for index in range(fresh, len(messages)):
        message = messages[index]
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            _check_blocks(content, f"messages[{index}].content")


def _check_blocks(blocks: list[Any], where: str) -> None:
    for index, block in enumerate(blocks):
        if not isinstance(block, dict):
            continue
        source = block.get("source")
        if isinstance(source, dict) and (source.get("type") == "file" or "file_id" in source):
            _refuse(f"{where}[{index}].source.file_id", "files")
        if "file_id" in block:  # a container_upload block
            _refuse(f"{where}[{index}].file_id", "files")
        nested = block.get("content")  # a tool_result's own blocks
        if isinstance(nested, list):
            _check_blocks(nested, f"{where}[{index}].content")


def refuse_chat_objects(body: dict[str, Any], raw: bytes) -> None:
    """A Chat Completions request's files named by id (`{"type": "file", "file": {"file_id"}}`
    parts) and past audio answers (an assistant's `{"audio": {"id"}}`). The chat route keeps
    no view of the last turn, so the whole history is walked, but only when the bytes could hold
    such a key: as is, or one of its letters escaped (`f i l e d a o` are \\u006x, `_`
    \\u005f, `u` \\u0075). Terminal output's common escapes (\\u001b, ...) do not count, so a
    long history pays a few byte searches, not a walk."""
    if (
        b"file_id" not in raw
        and b"audio" not in raw
        and b"\\u006" not in raw
        and b"\\u005" not in raw
        and b"\\u007" not in raw
    ):
        return
    for index, message in enumerate(body.get("messages") or ()):
        if not isinstance(message, dict):
            continue
        audio = message.get("audio")
        if isinstance(audio, dict) and audio.get("id") is not None:
            _refuse(f"messages[{index}].audio.id", "an audio answer")
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for at, part in enumerate(content):
            named = part.get("file") if isinstance(part, dict) else None
            if isinstance(named, dict) and named.get("file_id") is not None:
                _refuse(f"messages[{index}].content[{at}].file.file_id", "files")


def _refuse(where: str, what: str) -> None:
    raise BadRequest(
        f"'{where}' names {what} stored at the provider by id, and {SHARED_ACCOUNT}; send the "
        "content inline, or ask the operator (an operator who wants shared files runs the "
        "proxy without API keys, or gives each tenant its own provider account)",
        param=where,
        code="stored_object_refused",
    )
