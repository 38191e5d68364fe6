"""The simulated model plans a plausible tool call from a natural request with the tools it is
offered (proxy/sim/plans.py), through the real SDKs over sockets: "list the files here" with
Claude Code's, Codex's or the Gemini CLI's shell; "show me X" with a read tool; the agents'
context blocks around the words ignored; a short text once the result is back; JSON when a
schema asks for it; the same request, the same call."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from proxy.sim import Simulator, run_simulator

JSON = dict[str, Any]
KEY = "sk-sim-plans"
COMMAND = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
READ = {
    "type": "object",
    "properties": {"file_path": {"type": "string"}},
    "required": ["file_path"],
}
REMINDER = "<system-reminder>\nUse the Read tool to read files.\n</system-reminder>"


def chat_tool(name: str, parameters: JSON) -> JSON:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with run_simulator(Simulator(api_key=KEY, context_window=100_000)) as root:
        yield root


@pytest.fixture
async def chat(url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as sdk:
        yield sdk


@pytest.mark.parametrize(
    "shell", ["Bash", "exec_command", "run_shell_command", "shell_command", "bash"]
)
async def test_list_the_files_calls_the_offered_shell_with_ls_then_sums_up(
    chat: openai.AsyncOpenAI, shell: str
) -> None:
    key = "cmd" if shell == "exec_command" else "command"
    tools: Any = [chat_tool("Read", READ), chat_tool(shell, COMMAND)]
    asked: Any = [{"role": "user", "content": "list the files here"}]
    first = await chat.chat.completions.create(model="sim", messages=asked, tools=tools)
    [call] = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.type == "function" and call.function.name == shell
    assert json.loads(call.function.arguments)[key] == "ls"
    answered: Any = [
        *asked,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "README.md\nmain.py"},
    ]
    final = await chat.chat.completions.create(model="sim", messages=answered, tools=tools)
    assert final.choices[0].finish_reason == "stop"  # a one-shot agent ends here
    assert final.choices[0].message.content == f"{shell} returned: README.md\nmain.py"


async def test_the_same_request_plans_the_same_call(chat: openai.AsyncOpenAI) -> None:
    tools: Any = [chat_tool("Bash", COMMAND)]
    asked: Any = [{"role": "user", "content": "search for TODO"}]
    calls = [
        (await chat.chat.completions.create(model="sim", messages=asked, tools=tools))
        .choices[0]
        .message.tool_calls
        for _ in range(2)
    ]
    assert calls[0] == calls[1] and calls[0] is not None
    assert json.loads(calls[0][0].function.arguments)["command"] == "grep -rn TODO ."


async def test_without_a_matching_tool_or_request_it_answers_in_text(
    chat: openai.AsyncOpenAI,
) -> None:
    tools: Any = [chat_tool("Bash", COMMAND)]
    asked: Any = [{"role": "user", "content": "hello there"}]
    said = await chat.chat.completions.create(model="sim", messages=asked, tools=tools)
    assert said.choices[0].message.content == "You said: hello there"
    listed: Any = [{"role": "user", "content": "list the files here"}]
    untooled = await chat.chat.completions.create(model="sim", messages=listed)
    assert untooled.choices[0].message.content == "You said: list the files here"


async def test_claude_code_show_me_reads_the_file_past_its_reminders(url: str) -> None:
    tools: Any = [
        {"name": "Bash", "input_schema": COMMAND},
        {"name": "Read", "input_schema": READ},
    ]
    content: Any = [
        {"type": "text", "text": REMINDER},
        {"type": "text", "text": "show me README.md"},
    ]
    async with anthropic.AsyncAnthropic(base_url=url, api_key=KEY, max_retries=0) as sdk:
        first = await sdk.messages.create(
            model="claude-opus-5-5", max_tokens=1024, tools=tools,
            messages=[{"role": "user", "content": content}],
        )  # fmt: skip
        [use] = [block for block in first.content if block.type == "tool_use"]
        assert use.name == "Read" and use.input == {"file_path": "README.md"}
        # The result comes back with a reminder after it, as Claude Code sends it.
        result: Any = [
            {"type": "tool_result", "tool_use_id": use.id, "content": "# scratch"},
            {"type": "text", "text": REMINDER},
        ]
        final = await sdk.messages.create(
            model="claude-opus-5-5", max_tokens=1024, tools=tools,
            messages=[
                {"role": "user", "content": content},
                {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": result},
            ],
        )  # fmt: skip
    assert final.stop_reason == "end_turn"
    assert [b.text for b in final.content if b.type == "text"] == ["Read returned: # scratch"]


async def test_opencode_reads_with_read_file_path_and_searches_with_grep(
    chat: openai.AsyncOpenAI,
) -> None:
    """opencode's tools (1.18): `bash`, `read` taking `filePath`, `grep` taking `pattern`."""
    path = {"type": "object", "properties": {"filePath": {"type": "string"}}}
    pattern = {"type": "object", "properties": {"pattern": {"type": "string"}}}
    tools: Any = [
        chat_tool("bash", COMMAND), chat_tool("read", path), chat_tool("grep", pattern)
    ]  # fmt: skip
    calls = {}
    for words in ("show me README.md", "search for TODO"):
        asked: Any = [{"role": "user", "content": words}]
        said = await chat.chat.completions.create(model="sim", messages=asked, tools=tools)
        [call] = said.choices[0].message.tool_calls or []
        calls[call.function.name] = json.loads(call.function.arguments)
    assert calls == {"read": {"filePath": "README.md"}, "grep": {"pattern": "TODO"}}


async def test_codex_code_mode_exec_in_its_additional_tools_runs_ls(
    chat: openai.AsyncOpenAI,
) -> None:
    """Codex's default model offers its tools in an `additional_tools` input item: a
    `functions` namespace whose custom `exec` runs JavaScript over the nested tools."""
    exec_tool = {"type": "custom", "name": "exec", "description": "Run JavaScript"}
    wait = {"type": "function", "name": "wait", "parameters": {"type": "object"}}
    tools = {"type": "namespace", "name": "functions", "tools": [exec_tool, wait]}
    asked: Any = [
        {"type": "additional_tools", "role": "developer", "tools": [tools]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "<environment_context>\n<cwd>/r</cwd>\n"
                                           "</environment_context>"}]},
        {"type": "message", "role": "user", "content": "list the files here"},
    ]  # fmt: skip
    first = await chat.responses.create(model="gpt-6.2-sol", input=asked, tools=[])
    [call] = [item.model_dump() for item in first.output if item.type == "custom_tool_call"]
    assert call["name"] == "exec" and call["namespace"] == "functions"
    assert 'tools.exec_command({cmd: "ls"})' in call["input"]
    answered: Any = [
        *asked,
        call,
        {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "README.md"},
    ]
    final = await chat.responses.create(model="gpt-6.2-sol", input=answered, tools=[])
    assert final.output_text == "exec returned: README.md"


async def test_the_gemini_cli_lists_with_run_shell_command_and_gets_json_by_its_schema(
    url: str,
) -> None:
    client = genai.Client(
        api_key=KEY, http_options=types.HttpOptions(base_url=url, retry_options=None)
    )
    shell = types.FunctionDeclaration(name="run_shell_command", parameters_json_schema=COMMAND)
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[shell])])
    asked = types.Content(
        role="user",
        parts=[
            types.Part(text="<session_context>\nlinux\n</session_context>"),
            types.Part(text="list the files here"),
        ],
    )
    listing = await client.aio.models.generate_content(
        model="gemini-3.1-pro-preview", contents=[asked], config=config
    )
    [call] = listing.function_calls or []
    assert call.name == "run_shell_command" and call.args == {"command": "ls"}
    # The CLI wraps the output in <untrusted_context>: the summary quotes what is inside.
    output = "<untrusted_context>\nOutput: README.md\n</untrusted_context>"
    result = types.Part.from_function_response(name=call.name, response={"output": output})
    final = await client.aio.models.generate_content(
        model="gemini-3.1-pro-preview",
        contents=[
            asked,
            types.Content(role="model", parts=[types.Part(function_call=call)]),
            types.Content(role="user", parts=[result]),
        ],
        config=config,
    )
    assert final.text == "run_shell_command returned: Output: README.md\n"
    schema = {
        "type": "OBJECT",
        "properties": {"reason": {"type": "STRING"}, "score": {"type": "INTEGER"}},
        "required": ["reason", "score"],
    }
    scored = await client.aio.models.generate_content(
        model="gemini-3.5-flash-lite",
        contents="list the files here",
        config=types.GenerateContentConfig(
            response_mime_type="application/json", response_json_schema=schema
        ),
    )
    assert json.loads(scored.text or "") == {"reason": "example", "score": 1}
